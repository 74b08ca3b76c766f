// Command evalchat asks a model what held-out words mean, the README's kind of
// chat, and reports how its answers read: the share of answers that end with
// EOS within --max-tokens, the share of generated words that are English
// (found in a word list such as /usr/share/dict/words or train/data.py's
// words.txt), and whether any special token leaked into the text.
//
//	go run ./train/evalchat --model DIR --chats DIR/chat-heldout.jsonl --words DIR/words.txt
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/tokenizer"
)

func main() {
	dir := flag.String("model", "", "model directory")
	chats := flag.String("chats", "", "chat-heldout.jsonl of train/data.py (the questions are taken from it)")
	words := flag.String("words", "", "word list, one word per line")
	n := flag.Int("n", 20, "number of questions")
	maxTok := flag.Int("max-tokens", 200, "generation limit per answer")
	flag.Parse()
	if err := run(*dir, *chats, *words, *n, *maxTok, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "evalchat:", err)
		os.Exit(1)
	}
}

func run(dir, chats, wordList string, n, maxTok int, out io.Writer) error {
	w, _, err := checkpoint.Load(dir)
	if err != nil {
		return err
	}
	tok, err := tokenizer.LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return err
	}
	dict, err := loadWords(wordList)
	if err != nil {
		return err
	}
	qs, err := questions(chats, n)
	if err != nil {
		return err
	}
	m, err := model.New(w, nil, model.Options{})
	if err != nil {
		return err
	}
	var ended, english, total int
	leaked := false
	for _, q := range qs {
		text, err := tokenizer.EncodeChat([]tokenizer.Message{{Role: "user", Content: q}}, nil, tokenizer.ChatOptions{})
		if err != nil {
			return err
		}
		ans, eos, err := greedy(m, tok, text, w.Config.EOS, maxTok)
		if err != nil {
			return err
		}
		if eos {
			ended++
		}
		e, t := countEnglish(ans, dict)
		english += e
		total += t
		leaked = leaked || strings.Contains(ans, "<｜") || strings.Contains(ans, "｜DSML｜")
		fmt.Fprintf(out, "Q: %s\nA: %s%s\n\n", q, ans, map[bool]string{true: "", false: " [no EOS]"}[eos])
	}
	fmt.Fprintf(out, "answers ending with EOS within %d tokens: %d/%d (%.0f%%)\n", maxTok, ended, len(qs), 100*float64(ended)/float64(len(qs)))
	fmt.Fprintf(out, "English words: %d/%d (%.1f%%)\n", english, total, 100*float64(english)/float64(max(total, 1)))
	fmt.Fprintf(out, "special tokens in the text: %v\n", leaked)
	return nil
}

// greedy decodes the chat prompt until EOS or maxTok tokens; special tokens
// are left out of the returned text, as the API does.
func greedy(m *model.Model, tok *tokenizer.Tokenizer, prompt string, eos, maxTok int) (string, bool, error) {
	ids := tok.Encode(prompt)
	in := make([]int32, len(ids))
	for i, id := range ids {
		in[i] = int32(id)
	}
	seq := m.Cache().NewSequence()
	defer m.FreeSequence(seq)
	var gen []int
	for range maxTok {
		res, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: seq, Tokens: in}}})
		if err != nil {
			return "", false, err
		}
		next := engine.Argmax(res.Last(0))
		if int(next) == eos {
			return tok.Decode(gen), true, nil
		}
		if !tok.IsSpecial(int(next)) {
			gen = append(gen, int(next))
		}
		in = []int32{next}
	}
	return tok.Decode(gen), false, nil
}

func loadWords(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		d[strings.ToLower(strings.TrimSpace(sc.Text()))] = true
	}
	return d, sc.Err()
}

func questions(path string, n int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var qs []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() && len(qs) < n {
		var c struct {
			Messages []struct{ Role, Content string } `json:"messages"`
		}
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return nil, err
		}
		qs = append(qs, c.Messages[0].Content)
	}
	if len(qs) < n {
		return nil, fmt.Errorf("%s: %d questions, want %d", path, len(qs), n)
	}
	return qs, sc.Err()
}

// countEnglish counts the letter words of s (apostrophe forms and plurals
// reduced) and those found in dict.
func countEnglish(s string, dict map[string]bool) (int, int) {
	var e, t int
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return !unicode.IsLetter(r) && r != '\'' }) {
		w := strings.ToLower(strings.Trim(f, "'"))
		if w == "" {
			continue
		}
		t++
		if dict[w] || dict[strings.TrimSuffix(w, "'s")] || dict[strings.TrimSuffix(w, "s")] {
			e++
		}
	}
	return e, t
}
