package main

import (
	"math"
	"strings"

	"github.com/megamoe/megamoe/checkpoint"
)

// decodeFloorBytes is the least a decode step of batch sequences must read
// from device memory: every weight once (the head too), except the
// embedding and hash tables, of which it reads a row per token, and the
// routed experts, of which it reads those the tokens route to: E·(1-(1-k/E)^B)
// distinct experts per layer on average when routing is uniform (random
// weights).
func decodeFloorBytes(c *checkpoint.Config, formats checkpoint.FormatFunc, batch int) int64 {
	var dense, experts int64
	for _, s := range checkpoint.Tensors(c, formats) {
		switch {
		case s.Name == "embed.weight" || strings.HasSuffix(s.Name, ".tid2eid"):
		case strings.Contains(s.Name, ".ffn.experts."):
			experts += s.Bytes()
		default:
			dense += s.Bytes()
		}
	}
	if c.Experts == 0 {
		return dense
	}
	e, k := float64(c.Experts), float64(c.TopK)
	active := e * (1 - math.Pow(1-k/e, float64(batch)))
	return dense + int64(float64(experts)*active/e)
}
