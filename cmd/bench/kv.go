package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
)

// runKV is `bench kv [--preset P] [--context N]`: the cache size of one
// sequence per component, in the compact store (FP8 entries, FP4 index keys)
// and in today's fp32 store. The last line is the compact total,
// `PRESET: B bytes/token, G GiB at N tokens`.
func runKV(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench kv", flag.ContinueOnError)
	fs.SetOutput(stderr)
	preset := fs.String("preset", "flash", "architecture: small | flash | pro")
	tokens := fs.Int("context", 0, "sequence length in tokens (0 = the config's max_position_embeddings)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	c, err := checkpoint.PresetConfig(*preset)
	if err != nil {
		return fmt.Errorf("--preset: %w", err)
	}
	n := *tokens
	if n == 0 {
		n = c.MaxPositions
	}
	if n <= 0 {
		return errors.New("--context must be positive")
	}
	compact, err := kvcache.FootprintFromConfig(c, kvcache.StoreCompact)
	if err != nil {
		return err
	}
	f32, err := kvcache.FootprintFromConfig(c, kvcache.StoreF32)
	if err != nil {
		return err
	}
	if len(compact.Components) != len(f32.Components) {
		return errors.New("kv: the two stores list different components")
	}
	fmt.Fprintf(stdout, "preset %s  layers %d + %d MTP  window %d  context %d tokens\n", *preset, c.Layers, c.MTPLayers, c.Window, n)
	fmt.Fprintf(stdout, "%-34s %6s %8s %13s %15s   %13s %15s\n", "component", "layers", "entry B", "bytes/token", "fixed B/seq", "fp32 B/token", "fp32 fixed B")
	for i, p := range compact.Components {
		q := f32.Components[i]
		entry := "-" // pending state: no entries
		if p.EntryBytes > 0 {
			entry = strconv.Itoa(p.EntryBytes)
		}
		fmt.Fprintf(stdout, "%-34s %6d %8s %13.2f %15d   %13.2f %15d\n", p.Name, p.Layers, entry, p.PerToken, p.Fixed, q.PerToken, q.Fixed)
	}
	fmt.Fprintf(stdout, "%-34s %6s %8s %13.2f %15d   %13.2f %15d\n", "total", "", "", compact.PerToken(), compact.Fixed(), f32.PerToken(), f32.Fixed())
	fmt.Fprintf(stdout, "fp32 store: %.2f bytes/token, %.2f GiB at %d tokens\n", f32.PerToken(), inGiB(f32.BytesAt(n)), n)
	fmt.Fprintf(stdout, "%s: %.2f bytes/token, %.2f GiB at %d tokens\n", *preset, compact.PerToken(), inGiB(compact.BytesAt(n)), n)
	return nil
}

func inGiB(b int64) float64 { return float64(b) / (1 << 30) }
