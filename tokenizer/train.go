package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
)

// DeepSeek-V4's pre-tokenizer: three Split regexes (digits, CJK runs, the main
// punctuation/letter/whitespace pattern), then ByteLevel without its own regex.
var deepSeekSplits = []string{
	`\p{N}{1,3}`,
	`[一-龥぀-ゟ゠-ヿ]+`,
	"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
}

// DeepSeekV4SpecialTokens lists the added tokens of DeepSeek-V4 that the chat
// encoding writes (spec §10.1), in the order the small tokenizer numbers them.
func DeepSeekV4SpecialTokens() []string {
	return []string{
		"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>",
		"<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜", "<｜latest_reminder｜>",
	}
}

// TrainBPE learns a byte-level BPE tokenizer from corpus and returns it as a
// tokenizer.json with DeepSeek's structure. Ids: the special tokens first
// (0, 1, … in the given order, so BOS/EOS are 0/1 as in DeepSeek), then the 256
// byte tokens in byte order, then one token per learned merge. Merges are learned
// greedily: the most frequent adjacent pair over the pre-tokenized corpus, ties
// broken by the lexicographically smallest "a b" string, so training is
// deterministic. It stops at vocabSize ids or when no pair occurs twice.
func TrainBPE(corpus string, vocabSize int, special []string) ([]byte, error) {
	base := len(special) + 256
	if vocabSize < base {
		return nil, fmt.Errorf("train bpe: vocab size %d < %d special + byte tokens", vocabSize, base)
	}
	if len(corpus) == 0 {
		return nil, errors.New("train bpe: empty corpus")
	}
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
		return nil, fmt.Errorf("train bpe: %w", err)
	}
	// Word frequencies over byte-level symbols.
	freq := map[string]int{}
	for _, p := range pre.preTokenize(corpus, nil) {
		freq[p]++
	}
	type word struct {
		syms []string
		n    int
	}
	words := make([]word, 0, len(freq))
	for _, p := range sortedKeys(freq) {
		syms := make([]string, 0, len(p))
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
		merged := best[0] + best[1]
		if _, dup := vocab[merged]; dup {
			// Two different pairs can spell the same token; keep ids unique.
			for wi := range words {
				words[wi].syms = mergePair(words[wi].syms, best)
			}
			continue
		}
		vocab[merged] = len(special) + len(vocab)
		merges = append(merges, best)
		for wi := range words {
			words[wi].syms = mergePair(words[wi].syms, best)
		}
	}
	return tokenizerJSON(special, vocab, merges)
}

func mergePair(syms []string, pr [2]string) []string {
	out := syms[:0]
	for i := 0; i < len(syms); i++ {
		if i+1 < len(syms) && syms[i] == pr[0] && syms[i+1] == pr[1] {
			out = append(out, pr[0]+pr[1])
			i++
			continue
		}
		out = append(out, syms[i])
	}
	return out
}

func tokenizerJSON(special []string, vocab map[string]int, merges [][2]string) ([]byte, error) {
	type added struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	}
	addedTokens := make([]added, len(special))
	for i, s := range special {
		addedTokens[i] = added{ID: i, Content: s, Special: true}
	}
	pretok := []map[string]any{}
	for _, re := range deepSeekSplits {
		pretok = append(pretok, map[string]any{"type": "Split", "pattern": map[string]string{"Regex": re}, "behavior": "Isolated", "invert": false})
	}
	pretok = append(pretok, map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false})
	ms := make([]string, len(merges))
	for i, m := range merges {
		ms[i] = m[0] + " " + m[1]
	}
	doc := map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   addedTokens,
		"normalizer":     map[string]any{"type": "Sequence", "normalizers": []any{}},
		"pre_tokenizer":  map[string]any{"type": "Sequence", "pretokenizers": pretok},
		"post_processor": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocab, "merges": ms,
		},
	}
	return json.MarshalIndent(doc, "", " ")
}
