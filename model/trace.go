package model

import (
	"errors"
	"fmt"
	"strings"

	"github.com/megamoe/megamoe/backend"
)

// NonFiniteError reports the first non-finite value found by the tracer
// (Options.TraceNonFinite).
type NonFiniteError struct {
	Layer     int    // layer index (Layers = MTP block), -1 outside layers
	Component string // e.g. "layer 0 moe expert 17 w2"
	Row       int    // batch row
	Item      int    // batch item
	Position  int    // absolute position of the row
	Stats     backend.Stats
	Inputs    []backend.Stats
}

func fmtStats(s backend.Stats) string {
	return fmt.Sprintf("min %g max %g absmax %g", s.Min, s.Max, s.AbsMax)
}

func (e *NonFiniteError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "non-finite value in %s at row %d (item %d, position %d); output %s", e.Component, e.Row, e.Item, e.Position, fmtStats(e.Stats))
	for i, s := range e.Inputs {
		fmt.Fprintf(&b, "; input %d %s", i, fmtStats(s))
		if s.FirstBad >= 0 {
			b.WriteString(" (non-finite)")
		}
	}
	return b.String()
}

// tracer builds the CheckFunc of one layer.
type tracer struct {
	be    backend.Backend
	batch *backend.Batch
	probe func(component string, out backend.Tensor)
	stats bool // look for non-finite values
}

func (t *tracer) locate(e *NonFiniteError, row int) {
	e.Row = row
	if row >= 0 && row < len(t.batch.Pos) {
		e.Item = int(t.batch.Seq[row])
		e.Position = int(t.batch.Pos[row])
	}
}

func (t *tracer) check(layer int, prefix string) backend.CheckFunc {
	if t == nil {
		return nil
	}
	return func(component string, out backend.Tensor, inputs ...backend.Tensor) error {
		if out == nil {
			return nil
		}
		if t.probe != nil {
			t.probe(prefix+component, out)
		}
		if !t.stats || out.DType() != backend.F32 {
			return nil
		}
		st := t.be.Stats(out)
		if st.FirstBad < 0 {
			return nil
		}
		e := &NonFiniteError{Layer: layer, Component: prefix + component, Stats: st}
		t.locate(e, st.FirstBad/max(out.Cols(), 1))
		for _, in := range inputs {
			e.Inputs = append(e.Inputs, t.be.Stats(in))
		}
		return e
	}
}

// wrapOp converts an op-internal trace error into a NonFiniteError.
func (t *tracer) wrapOp(err error, layer int, prefix string) error {
	if t == nil || err == nil {
		return err
	}
	var op *backend.OpNonFinite
	if errors.As(err, &op) {
		e := &NonFiniteError{Layer: layer, Component: prefix + op.Component, Stats: op.Stats, Inputs: []backend.Stats{op.In}}
		t.locate(e, op.Row)
		return e
	}
	return err
}
