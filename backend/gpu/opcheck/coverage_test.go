package opcheck

import (
	"slices"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/observe"
)

// observed is a cpuDevice whose backend ops go through an observe hook.
type observed struct {
	*observe.Backend
	d cpuDevice
}

func (o observed) Poison(t backend.Tensor) error                     { return o.d.Poison(t) }
func (o observed) UploadI32(t backend.Tensor, v []int32) error       { return o.d.UploadI32(t, v) }
func (o observed) NewVec(v []float32) (backend.Vec, error)           { return o.d.NewVec(v) }
func (o observed) NewMat(r, c int, v []float32) (backend.Mat, error) { return o.d.NewMat(r, c, v) }
func (o observed) Sync() error                                       { return nil }
func (o observed) NewHC(mix, width int, fn, base, scale []float32) (backend.HC, error) {
	return o.d.NewHC(mix, width, fn, base, scale)
}

// ran records the ops it is handed and runs them.
type ran map[string]bool

func (r ran) Op(c *observe.Call, run func() error) error { r[c.Op] = true; return run() }

// TestCheckOpsCoversOpTable: CheckOps runs every Compute and Fused op of
// backend.Ops on the device under test, so a new op cannot go unchecked.
func TestCheckOpsCoversOpTable(t *testing.T) {
	seen := ran{}
	d := cpuDevice{cpu.New(cpu.Options{})}
	CheckOps(observed{observe.Wrap(d, seen), d}, tinyDims(), backend.Exact, 1, "", t)
	for _, op := range backend.OpsOf(backend.Compute, backend.Fused) {
		if !seen[op] {
			t.Errorf("CheckOps never runs %s on the device", op)
		}
	}
	if len(seen) == 0 || !slices.Contains(backend.OpsOf(backend.Compute), "Linear") {
		t.Fatal("no ops seen")
	}
}
