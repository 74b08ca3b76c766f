package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"

	"github.com/megamoe/megamoe/backend/gpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// The KV cache's size comes from --kv-cache-memory, else on a GPU from
// --gpu-memory-utilization (its memory less what is in use once the weights
// are loaded and less the step workspace), else on the CPU
// model.DefaultCacheBytes. The context length is then --max-model-len, or by
// default the config's max_position_embeddings when the cache holds one such
// sequence, else the longest it holds.

// fallbackContext stands for the longest context of a config without
// max_position_embeddings when sizing the step workspace.
const fallbackContext = 1 << 20

func addCapacityFlags(fs *flag.FlagSet, o *options) {
	fs.IntVar(&o.maxModelLen, "max-model-len", 0, "context length in tokens, prompt + output (default: the model's max_position_embeddings, or the longest the KV cache holds when that is less)")
	fs.Int64Var(&o.kvCacheMemory, "kv-cache-memory", 0, "KV cache capacity in bytes (default: on a GPU, --gpu-memory-utilization of its memory less the weights and the step workspace; on the CPU 1 GiB)")
	fs.Float64Var(&o.gpuMemUtil, "gpu-memory-utilization", 0.9, "fraction of the GPU's memory the server may take: weights, step workspace and KV cache (--kv-cache-memory sets the cache's size instead)")
}

// checkCapacityFlags validates the flags addCapacityFlags defined; their zero
// defaults mean "choose", so an explicit value is checked as given.
func checkCapacityFlags(fs *flag.FlagSet, o *options) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case o.maxModelLen < 0 || set["max-model-len"] && o.maxModelLen < 2:
		return errors.New("--max-model-len must be >= 2")
	case o.kvCacheMemory < 0 || set["kv-cache-memory"] && o.kvCacheMemory == 0:
		return errors.New("--kv-cache-memory must be > 0")
	case !(o.gpuMemUtil > 0 && o.gpuMemUtil <= 1):
		return fmt.Errorf("--gpu-memory-utilization %v must be in (0, 1]", o.gpuMemUtil)
	}
	return nil
}

// cacheOptions sets how the model sizes its cache: from the device when the
// model runs on GPUs (gs, one per rank) and no --kv-cache-memory was given.
// Slots are capped at the running sequences, since the GPU store sets aside
// every slot's state.
func cacheOptions(opts *model.Options, o *options, c *checkpoint.Config, gs []*gpu.Backend, log *slog.Logger) {
	opts.CacheBytes, opts.MaxSeqs = o.kvCacheMemory, o.maxNumSeqs
	opts.MaxSeqs *= slotsPerSeq(o) // a drafting sequence also holds a snapshot slot
	if len(gs) == 0 || o.kvCacheMemory > 0 {
		return
	}
	var first int64 // rank 0's size: every rank mirrors its sequences
	rank := 0
	opts.SizeCache = func(l kvcache.Layout) (int64, error) {
		if rank >= len(gs) {
			return 0, fmt.Errorf("cache sized for %d ranks, not more", len(gs))
		}
		n, err := gpuCacheBytes(gs[rank], o, c, l, log)
		if err != nil {
			return 0, fmt.Errorf("GPU %d: %w", rank, err)
		}
		if rank++; rank == 1 {
			first = n
			return n, nil
		}
		if n < first {
			return 0, fmt.Errorf("GPU %d has room for a KV cache of %s, less than GPU 0's %s: set --kv-cache-memory", rank-1, formatBytes(n), formatBytes(first))
		}
		return first, nil
	}
}

// gpuCacheBytes sizes the cache of the model on g (its weights loaded).
func gpuCacheBytes(g *gpu.Backend, o *options, c *checkpoint.Config, l kvcache.Layout, log *slog.Logger) (int64, error) {
	ctxLen := o.maxModelLen
	if ctxLen == 0 {
		ctxLen = c.MaxPositions
	}
	if ctxLen <= 0 {
		ctxLen = fallbackContext
	}
	ws, err := g.StepWorkspace(c, gpu.StepShape{Rows: o.maxBatchTokens, Seqs: o.maxNumSeqs, Context: ctxLen, Graphs: o.cudaGraphs})
	if err != nil {
		return 0, err
	}
	// Staging blocks of the weights' preparation go back to the driver, so
	// that what is in use is what stays.
	if err := g.Context().Pool().Trim(); err != nil {
		return 0, err
	}
	free, total, err := g.Context().MemInfo()
	if err != nil {
		return 0, err
	}
	d := deviceBudget{util: o.gpuMemUtil, total: int64(total), used: int64(total - free), workspace: ws,
		slots: int64(slotsPerSeq(o)*o.maxNumSeqs) * l.StateBytes}
	n, err := d.cacheBytes()
	if err != nil {
		return 0, err
	}
	log.Info("KV cache sized from the GPU", "device", g.Device().Name, "gpu_memory_utilization", o.gpuMemUtil, "total", formatBytes(d.total),
		"in_use_after_weights", formatBytes(d.used), "step_workspace", formatBytes(ws), "kv_cache", formatBytes(n))
	return n, nil
}

// deviceBudget is a GPU's memory as the cache's sizing sees it.
type deviceBudget struct {
	util             float64
	total, used      int64 // bytes; used: by anyone, after the weights were loaded
	workspace, slots int64 // step workspace; fixed state of every sequence slot
}

// cacheBytes is the cache's capacity: util·total less what is in use and the
// workspace. The store sets aside every slot's fixed state beside the blocks,
// so that much less again.
func (d deviceBudget) cacheBytes() (int64, error) {
	budget := int64(d.util * float64(d.total))
	n := budget - d.used - d.workspace - d.slots
	if n <= 0 {
		return 0, fmt.Errorf("--gpu-memory-utilization %v allows %s of the GPU's %s, but %s are in use after loading the weights and steps need %s of workspace: nothing is left for the KV cache (raise --gpu-memory-utilization, lower --max-num-batched-tokens, --max-model-len or --max-num-seqs, or set --kv-cache-memory)",
			d.util, formatBytes(budget), formatBytes(d.total), formatBytes(d.used), formatBytes(d.workspace))
	}
	return n, nil
}

// contextLength picks the context length: requested (0: choose) within the
// config's max positions (0: none) and what one sequence of the cache holds
// (fit, kvcache.Manager.MaxTokens(1)).
func contextLength(requested, maxPos, fit int, capacity int64) (n int, lowered bool, err error) {
	if requested > 0 {
		if maxPos > 0 && requested > maxPos {
			return 0, false, fmt.Errorf("--max-model-len %d exceeds the model's max_position_embeddings %d", requested, maxPos)
		}
		if requested > fit {
			return 0, false, fmt.Errorf("--max-model-len %d does not fit: the KV cache of %s holds one sequence of at most %d tokens; set --max-model-len %d or less, or give the cache more memory (--kv-cache-memory, --gpu-memory-utilization)",
				requested, formatBytes(capacity), fit, fit)
		}
		return requested, false, nil
	}
	if maxPos > 0 && fit >= maxPos {
		return maxPos, false, nil
	}
	if fit < 2 {
		return 0, false, fmt.Errorf("the KV cache of %s cannot hold one sequence of 2 tokens: give it more memory (--kv-cache-memory, --gpu-memory-utilization)", formatBytes(capacity))
	}
	return fit, maxPos > 0, nil
}

// reportCache logs the cache's figures (as bench kv prints them) and its
// capacity in tokens.
func reportCache(log *slog.Logger, c *checkpoint.Config, cache *kvcache.Manager, seqs int) error {
	f, err := kvcache.FootprintFromConfig(c, cache.Layout().Store)
	if err != nil {
		return err
	}
	for _, p := range f.Components {
		log.Info("KV cache component", "name", p.Name, "layers", p.Layers, "bytes_per_token", fmt.Sprintf("%.2f", p.PerToken), "fixed_bytes_per_seq", p.Fixed)
	}
	per := cache.MaxTokens(seqs)
	log.Info("KV cache", "store", f.Store.String(), "capacity", formatBytes(cache.CapacityBytes()),
		"bytes_per_token", fmt.Sprintf("%.2f", f.PerToken()), "fixed_bytes_per_seq", f.Fixed(),
		"tokens_one_seq", cache.MaxTokens(1), "max_num_seqs", seqs, "tokens_per_seq_at_max_num_seqs", per, "tokens_at_max_num_seqs", per*seqs)
	return nil
}

// slotsPerSeq is the state slots one running sequence holds: its own, and a
// snapshot with speculative decoding.
func slotsPerSeq(o *options) int {
	if o.spec.Enabled() {
		return 2
	}
	return 1
}
