package tokenizer

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
)

// The DeepSeek-V3 tokenizer.json, whose 128,000-token BPE core and ids up to
// 128814 V4 inherits (spec §10.1); V4's own file is not shipped with the code.
//
//go:embed testdata/deepseek_v3_tokenizer.json.gz
var v3TokenizerGZ []byte

// SynthV4Vocab is the id count of DeepSeek-V4 (Flash and Pro).
const SynthV4Vocab = 129280

// SynthV4 returns a V4-shaped tokenizer for models with random weights: the
// DeepSeek-V3 tokenizer with V4's special tokens and placeholders added up
// to 129,280 ids, so that every id a V4-sized head can draw decodes and the
// chat encoding's control tokens are single ids. Text encodes as V3 encodes
// it, which may differ from V4's own tokenizer.json.
func SynthV4() (*Tokenizer, error) {
	zr, err := gzip.NewReader(bytes.NewReader(v3TokenizerGZ))
	if err != nil {
		return nil, fmt.Errorf("synthetic V4 tokenizer: %w", err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("synthetic V4 tokenizer: gunzip: %w", err)
	}
	var f map[string]json.RawMessage
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("synthetic V4 tokenizer: %w", err)
	}
	var added []map[string]any
	if err := json.Unmarshal(f["added_tokens"], &added); err != nil {
		return nil, fmt.Errorf("synthetic V4 tokenizer: added_tokens: %w", err)
	}
	// V4's added tokens beyond V3's last id (spec §10.1); the other ids up
	// to SynthV4Vocab are placeholders.
	v4Added := map[int]string{
		128821: ThinkOpen, 128822: ThinkClose, 128825: DSML, 128828: LatestReminder,
		128829: "<｜action｜>", 128830: "<｜query｜>", 128831: "<｜authority｜>", 128832: "<｜domain｜>",
		128836: "<｜title｜>", 128844: "<｜extracted_url｜>", 128845: "<｜read_url｜>",
	}
	next := 0
	for _, a := range added {
		if id, ok := a["id"].(float64); ok {
			next = max(next, int(id)+1)
		}
	}
	for id := next; id < SynthV4Vocab; id++ {
		content, named := v4Added[id]
		if !named {
			content = fmt.Sprintf("<｜place▁holder▁no▁%d｜>", id-128000)
		}
		added = append(added, map[string]any{"id": id, "content": content, "single_word": false,
			"lstrip": false, "rstrip": false, "normalized": named, "special": !named})
	}
	if f["added_tokens"], err = json.Marshal(added); err != nil {
		return nil, fmt.Errorf("synthetic V4 tokenizer: %w", err)
	}
	if data, err = json.Marshal(f); err != nil {
		return nil, fmt.Errorf("synthetic V4 tokenizer: %w", err)
	}
	t, err := Load(data)
	if err != nil {
		return nil, fmt.Errorf("synthetic V4 tokenizer: %w", err)
	}
	return t, nil
}
