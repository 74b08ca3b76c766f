package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
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
	merges, err := learnMerges(pre, corpus, vocab, len(special), vocabSize)
	if err != nil {
		return nil, err
	}
	return tokenizerJSON(special, vocab, merges)
}

// learnMerges adds merges to vocab until it holds vocabSize-nSpecial tokens.
// Pair counts are kept up to date incrementally: a merge only recounts the
// words that contain its pair, which makes training on megabytes of text take
// seconds. The result equals a full recount per merge (trainBPENaive in the
// tests): the most frequent pair, ties broken by the smallest "a b" string.
func learnMerges(pre *Tokenizer, corpus string, vocab map[string]int, nSpecial, vocabSize int) ([][2]string, error) {
	b2u := bytesToUnicode()
	freq := map[string]int{}
	for _, p := range pre.preTokenize(corpus, nil) {
		freq[p]++
	}
	var names []string
	ids := map[string]int32{}
	intern := func(s string) int32 {
		id, ok := ids[s]
		if !ok {
			id = int32(len(names))
			ids[s] = id
			names = append(names, s)
		}
		return id
	}
	type pair [2]int32
	type word struct {
		syms []int32
		n    int
	}
	words := make([]word, 0, len(freq))
	counts := map[pair]int{}
	where := map[pair][]int32{} // words holding the pair (may repeat or be stale)
	for _, p := range sortedKeys(freq) {
		syms := make([]int32, 0, len(p))
		for i := 0; i < len(p); i++ {
			syms = append(syms, intern(string(b2u[p[i]])))
		}
		wi := int32(len(words))
		words = append(words, word{syms, freq[p]})
		for i := 0; i+1 < len(syms); i++ {
			pr := pair{syms[i], syms[i+1]}
			counts[pr] += freq[p]
			where[pr] = append(where[pr], wi)
		}
	}
	key := func(pr pair) string { return names[pr[0]] + " " + names[pr[1]] }
	var merges [][2]string
	for nSpecial+len(vocab) < vocabSize {
		var best pair
		bestN := 1
		for pr, n := range counts {
			if n > bestN || (n == bestN && bestN > 1 && key(pr) < key(best)) {
				best, bestN = pr, n
			}
		}
		if bestN < 2 {
			break
		}
		merged := names[best[0]] + names[best[1]]
		if _, dup := vocab[merged]; !dup {
			// Two different pairs can spell the same token; ids stay unique.
			vocab[merged] = nSpecial + len(vocab)
			merges = append(merges, [2]string{names[best[0]], names[best[1]]})
		}
		m := intern(merged)
		seen := map[int32]bool{}
		for _, wi := range where[best] {
			if seen[wi] {
				continue
			}
			seen[wi] = true
			w := &words[wi]
			for i := 0; i+1 < len(w.syms); i++ {
				if c := counts[pair{w.syms[i], w.syms[i+1]}] - w.n; c > 0 {
					counts[pair{w.syms[i], w.syms[i+1]}] = c
				} else {
					delete(counts, pair{w.syms[i], w.syms[i+1]})
				}
			}
			w.syms = mergeIDs(w.syms, best, m)
			for i := 0; i+1 < len(w.syms); i++ {
				pr := pair{w.syms[i], w.syms[i+1]}
				counts[pr] += w.n
				if pr[0] == m || pr[1] == m {
					where[pr] = append(where[pr], wi)
				}
			}
		}
		delete(where, best)
	}
	return merges, nil
}

// mergeIDs replaces each left-to-right occurrence of pr in syms by m.
func mergeIDs(syms []int32, pr [2]int32, m int32) []int32 {
	out := syms[:0]
	for i := 0; i < len(syms); i++ {
		if i+1 < len(syms) && syms[i] == pr[0] && syms[i+1] == pr[1] {
			out = append(out, m)
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
	// The model's vocab lists the special tokens at their ids too, as
	// DeepSeek's files do: Hugging Face's tokenizers keeps an added token's
	// id only when the model knows it, and numbers it after the vocab otherwise.
	full := make(map[string]int, len(vocab)+len(special))
	maps.Copy(full, vocab)
	for i, sp := range special {
		full[sp] = i
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
			"vocab": full, "merges": ms,
		},
	}
	return json.MarshalIndent(doc, "", " ")
}
