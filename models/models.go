// Package models embeds the default small DeepSeek-V4 checkpoint (models/small:
// the small architecture trained on English text by train/, official FP8 +
// MXFP4 format, its own BPE tokenizer; docs/training.md) so that the engine
// runs out of the box and answers in English, and names in-memory synthetic
// models (Synth).
package models

import (
	"crypto/sha256"

	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
)

// SmallSeed is the seed of synth models (synth:small is `mkmodel --preset
// small --seed 1`).
const SmallSeed = 1

// Small returns the embedded checkpoint's files (rooted at the model dir).
func Small() fs.FS {
	sub, err := fs.Sub(small, "small")
	if err != nil { // "small" is a literal, embedded path
		panic(err)
	}
	return sub
}

// smallFiles lists the embedded files in name order.
func smallFiles() ([]string, error) {
	ents, err := fs.ReadDir(small, "small")
	if err != nil {
		if !Embedded {
			return nil, errors.New("this binary was built with -tags noembed, without the default model: pass --model DIR (for example models/small)")
		}
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}

// SmallDigest is a hex sha256 over the embedded files' names and contents.
func SmallDigest() (string, error) {
	names, err := smallFiles()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, n := range names {
		data, err := small.ReadFile(path.Join("small", n))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(data))
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ExtractSmall writes the embedded model once into
// os.UserCacheDir()/megamoe/models/small-<digest>/ and returns that directory
// (so the loader can mmap the shards). Extraction goes to a temporary
// directory renamed into place, so a concurrent or interrupted run never
// leaves a partial model behind.
func ExtractSmall() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("extract small model: %w", err)
	}
	return extractSmall(filepath.Join(cache, "megamoe", "models"))
}

func extractSmall(root string) (string, error) {
	digest, err := SmallDigest()
	if err != nil {
		return "", fmt.Errorf("extract small model: %w", err)
	}
	dir := filepath.Join(root, "small-"+digest[:16])
	if st, err := os.Stat(dir); err == nil && st.IsDir() {
		return dir, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("extract small model: %w", err)
	}
	tmp, err := os.MkdirTemp(root, ".small-tmp-")
	if err != nil {
		return "", fmt.Errorf("extract small model: %w", err)
	}
	defer os.RemoveAll(tmp) // no-op after a successful rename
	names, err := smallFiles()
	if err != nil {
		return "", fmt.Errorf("extract small model: %w", err)
	}
	for _, n := range names {
		data, err := small.ReadFile(path.Join("small", n))
		if err != nil {
			return "", fmt.Errorf("extract small model: %w", err)
		}
		if err := os.WriteFile(filepath.Join(tmp, n), data, 0o644); err != nil {
			return "", fmt.Errorf("extract small model: %w", err)
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("extract small model: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another process may have won the race; its copy is identical.
		if st, serr := os.Stat(dir); serr == nil && st.IsDir() {
			return dir, nil
		}
		return "", fmt.Errorf("extract small model: %w", errors.Join(err))
	}
	return dir, nil
}
