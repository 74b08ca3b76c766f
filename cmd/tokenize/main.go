// Command tokenize encodes stdin with a tokenizer.json and prints the ids as a
// JSON array; with --decode it reads a JSON array of ids and prints the text.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/megamoe/megamoe/tokenizer"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "tokenize:", err)
		os.Exit(1)
	}
}

func run(args []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	path := fs.String("tokenizer", "", "tokenizer.json (or .json.gz)")
	decode := fs.Bool("decode", false, "read a JSON array of ids and print the text")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		return errors.New("--tokenizer is required")
	}
	tok, err := tokenizer.LoadFile(*path)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(in)
	if err != nil {
		return fmt.Errorf("read stdin: %w", err)
	}
	if *decode {
		var ids []int
		if err := json.Unmarshal(data, &ids); err != nil {
			return fmt.Errorf("stdin is not a JSON array of ids: %w", err)
		}
		for _, id := range ids {
			if _, ok := tok.TokenString(id); !ok {
				return fmt.Errorf("id %d is not in the vocabulary", id)
			}
		}
		_, err = io.WriteString(out, tok.Decode(ids))
		return err
	}
	ids := tok.Encode(string(data))
	if ids == nil {
		ids = []int{}
	}
	enc, _ := json.Marshal(ids)
	_, err = fmt.Fprintln(out, string(enc))
	return err
}
