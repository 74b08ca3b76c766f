// Command prep turns the text of train/data.py into the trainer's token
// streams: it learns a byte-level BPE tokenizer with DeepSeek-V4's special
// tokens on the training split (tokenizer.TrainBPE), renders the chats with
// the V4 chat encoding (tokenizer.EncodeChat, the engine's own), and writes
// DIR/tokenizer.json, DIR/tokenizer_config.json and DIR/{train,heldout}.bin
// (little-endian uint16 ids; every document starts with BOS and ends with EOS).
//
//	go run ./train/prep --data DIR [--vocab 4096]
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/megamoe/megamoe/tokenizer"
)

// sep separates documents in train/data.py's text files.
const sep = "\n\x1e\n"

func main() {
	data := flag.String("data", "", "directory written by train/data.py")
	vocab := flag.Int("vocab", 4096, "tokenizer vocabulary size (special + byte + merge tokens)")
	sample := flag.Int("bpe-chars", 4<<20, "characters of the training text the BPE merges are learned on")
	flag.Parse()
	if err := run(*data, *vocab, *sample, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "prep:", err)
		os.Exit(1)
	}
}

func run(dir string, vocab, sample int, log io.Writer) error {
	if dir == "" {
		return fmt.Errorf("--data is required")
	}
	if vocab > math.MaxUint16+1 {
		return fmt.Errorf("--vocab %d does not fit uint16 ids", vocab)
	}
	train, err := os.ReadFile(filepath.Join(dir, "train.txt"))
	if err != nil {
		return err
	}
	corpus := string(train[:min(len(train), sample)])
	tj, err := tokenizer.TrainBPE(corpus, vocab, tokenizer.DeepSeekV4SpecialTokens())
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644); err != nil {
		return err
	}
	tok, err := tokenizer.Load(tj)
	if err != nil {
		return err
	}
	for _, split := range []string{"train", "heldout"} {
		n, err := encodeSplit(dir, split, tok)
		if err != nil {
			return fmt.Errorf("%s: %w", split, err)
		}
		fmt.Fprintf(log, "%s: %d tokens\n", split, n)
	}
	return nil
}

// encodeSplit writes DIR/SPLIT.bin: the split's documents, then its chats.
func encodeSplit(dir, split string, tok *tokenizer.Tokenizer) (int, error) {
	text, err := os.ReadFile(filepath.Join(dir, split+".txt"))
	if err != nil {
		return 0, err
	}
	var ids []uint16
	add := func(toks []int) {
		for _, t := range toks {
			ids = append(ids, uint16(t))
		}
	}
	for _, doc := range strings.Split(strings.TrimSpace(string(text)), sep) {
		add([]int{0})
		add(tok.EncodeOrdinary(doc))
		add([]int{1})
	}
	f, err := os.Open(filepath.Join(dir, "chat-"+split+".jsonl"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		s, err := renderChat(sc.Bytes())
		if err != nil {
			return 0, err
		}
		add(tok.Encode(s))
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	b := make([]byte, 2*len(ids))
	for i, v := range ids {
		binary.LittleEndian.PutUint16(b[2*i:], v)
	}
	return len(ids), os.WriteFile(filepath.Join(dir, split+".bin"), b, 0o644)
}

// renderChat renders one chat of train/data.py with the V4 encoding; one chat
// in eight is rendered in thinking mode with a one-sentence reasoning, so the
// model learns to close its thinking block.
func renderChat(line []byte) (string, error) {
	var c struct {
		Messages []struct{ Role, Content string } `json:"messages"`
	}
	if err := json.Unmarshal(line, &c); err != nil {
		return "", err
	}
	h := fnv.New32a()
	h.Write(line)
	thinking := h.Sum32()%8 == 0
	var msgs []tokenizer.Message
	for _, m := range c.Messages {
		msg := tokenizer.Message{Role: m.Role, Content: m.Content}
		if thinking && m.Role == "assistant" {
			msg.ReasoningContent = "The user asks what a word means. I give its definition."
		}
		msgs = append(msgs, msg)
	}
	return tokenizer.EncodeChat(msgs, nil, tokenizer.ChatOptions{Thinking: thinking, KeepThinking: true})
}
