// Command mkmodel writes a small seeded DeepSeek-V4 checkpoint of the exact
// architecture and on-disk format of the real models (see docs/checkpoints.md).
//
//	mkmodel --out DIR [--format official|nvfp4] [--seed N] [--preset small]
//	mkmodel --out DIR --from TRAINED --tokenizer tokenizer.json [--format ...]
//
// --from writes a model trained by train/train.py (docs/training.md) in the
// release formats instead of drawing random weights.
//
// The committed default model models/small was made with
//
//	go run ./cmd/mkmodel --out models/small --format official --seed 1 --preset small
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/megamoe/megamoe/checkpoint"
)

func main() {
	out := flag.String("out", "", "output directory (created if needed)")
	format := flag.String("format", checkpoint.GenOfficial, "checkpoint format: official (FP8 + MXFP4 experts) or nvfp4 (ModelOpt NVFP4 experts)")
	seed := flag.Uint64("seed", 1, "random seed for the weights")
	preset := flag.String("preset", "small", "architecture preset: small, small-tp (splits over 2 and 4 ranks) or small-dspark (a DSpark drafter instead of the MTP block)")
	from := flag.String("from", "", "a trained model directory (train/train.py --out) to write instead of random weights")
	tok := flag.String("tokenizer", "", "with --from: the model's tokenizer.json")
	shard := flag.Int64("max-shard-bytes", 0, "bound on one shard's tensor data (0: a third of the total)")
	flag.Parse()
	if *out == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: mkmodel --out DIR [--format official|nvfp4] [--seed N] [--preset small]")
		os.Exit(2)
	}
	if err := checkpoint.Generate(*out, checkpoint.GenSpec{Format: *format, Seed: *seed, Preset: *preset, From: *from, Tokenizer: *tok, MaxShardBytes: *shard}); err != nil {
		fmt.Fprintln(os.Stderr, "mkmodel:", err)
		os.Exit(1)
	}
}
