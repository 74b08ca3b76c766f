package model

import (
	"errors"
	"fmt"
	"strings"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/observe"
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

// tracer is the observe.Hook of Options.TraceNonFinite and Options.Probe:
// after every op it probes the op's outputs and looks for non-finite
// values, naming them by the region the model is in ("layer 2 attn") and
// the output ("wq_b", "router ids").
type tracer struct {
	be     backend.Backend // the traced backend, for Stats
	probe  func(component string, out backend.Tensor)
	stats  bool // look for non-finite values
	batch  *backend.Batch
	layer  int
	region string
	rows   []int // batch row of each row of the region's tensors (nil: the same)
}

// at sets the region of the ops that follow (nil t: no tracing).
func (t *tracer) at(layer int, region string, rows []int) {
	if t != nil {
		t.layer, t.region, t.rows = layer, region, rows
	}
}

// name is the component of output out in the current region; a weight's
// name drops its sub-layer ("attn.wq_b" is "wq_b" in "layer 2 attn").
func (t *tracer) name(out string) string {
	if i := strings.IndexByte(out, '.'); i >= 0 && t.region != "" {
		out = out[i+1:]
	}
	if t.region == "" {
		return out
	}
	return t.region + " " + out
}

func (t *tracer) locate(e *NonFiniteError, row int) {
	if t.rows != nil && row >= 0 && row < len(t.rows) {
		row = t.rows[row]
	}
	e.Row = row
	if row >= 0 && t.batch != nil && row < len(t.batch.Pos) {
		e.Item = int(t.batch.Seq[row])
		e.Position = int(t.batch.Pos[row])
	}
}

// Op implements observe.Hook.
func (t *tracer) Op(c *observe.Call, run func() error) error {
	if err := run(); err != nil {
		var op *backend.OpNonFinite
		if errors.As(err, &op) {
			e := &NonFiniteError{Layer: t.layer, Component: t.region + " " + op.Component, Stats: op.Stats, Inputs: []backend.Stats{op.In}}
			t.locate(e, op.Row)
			return e
		}
		return err
	}
	for _, o := range c.Outs {
		if o.T == nil {
			continue
		}
		if t.probe != nil {
			t.probe(t.name(o.Name), o.T)
		}
		if !t.stats || o.T.DType() != backend.F32 {
			continue
		}
		st := t.be.Stats(o.T)
		if st.FirstBad < 0 {
			continue
		}
		e := &NonFiniteError{Layer: t.layer, Component: t.name(o.Name), Stats: st}
		t.locate(e, st.FirstBad/max(o.T.Cols(), 1))
		for _, in := range c.Ins {
			if in != nil {
				e.Inputs = append(e.Inputs, t.be.Stats(in))
			}
		}
		return e
	}
	return nil
}
