package main

import (
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/models"
)

// TestBuildModelTensorParallel: --tensor-parallel 2 on the CPU builds the
// split model, which the engine drives like a single one and which gives the
// same greedy token as one rank in exact numerics; a model whose output
// groups do not split is refused with the reason.
func TestBuildModelTensorParallel(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	w, st, err := checkpoint.GenerateLoad(filepath.Join(t.TempDir(), "tp"), checkpoint.GenSpec{Seed: 2, Preset: "small-tp"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	next := func(tp int) int32 {
		o := &options{device: "cpu", numerics: "exact", tp: tp, threads: 2, kvCacheMemory: 16 << 20}
		m, _, err := buildModel(w, o, log)
		if err != nil {
			t.Fatalf("tp %d: %v", tp, err)
		}
		if _, ok := m.(*model.Parallel); ok != (tp > 1) {
			t.Fatalf("tp %d built %T", tp, m)
		}
		em := engine.FromModel(m)
		s := em.Cache().NewSequence()
		defer em.FreeSequence(s)
		logits, err := em.Forward([]engine.ForwardItem{{Seq: s, Tokens: []int32{3, 1, 4, 1, 5, 9, 2, 6}}})
		if err != nil {
			t.Fatalf("tp %d: %v", tp, err)
		}
		return engine.Argmax(logits[0])
	}
	if a, b := next(1), next(2); a != b {
		t.Errorf("greedy token: 1 rank %d, 2 ranks %d", a, b)
	}
	dir, err := models.ExtractSmall()
	if err != nil {
		t.Fatal(err)
	}
	ws, st2, err := checkpoint.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	_, _, err = buildModel(ws, &options{device: "cpu", numerics: "faithful", tp: 2, kvCacheMemory: 16 << 20}, log)
	if err == nil || !strings.Contains(err.Error(), "OGroups") {
		t.Errorf("embedded small model over 2 ranks: %v, want the OGroups divisibility error", err)
	}
}
