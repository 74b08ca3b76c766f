package observe

import (
	"reflect"
	"testing"

	"github.com/megamoe/megamoe/backend"
)

func TestSnake(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Linear", "linear"},
		{"LinearF32", "linear_f32"},
		{"ExpertsCombine", "experts_combine"},
		{"HcPreNormLinears", "hc_pre_norm_linears"},
		{"HadamardFP4", "hadamard_fp4"},
		{"NormRopeKVQuant", "norm_rope_kv_quant"},
		{"IndexerTopK", "indexer_top_k"},
		{"SwiGLULinear", "swiglu_linear"},
	} {
		if got := Snake(c.in); got != c.want {
			t.Errorf("Snake(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// seen records the ops a hook was handed, without running them.
type seen map[string]int

func (s seen) Op(c *Call, run func() error) error { s[c.Op]++; return nil }

// TestEveryOpReachesTheHook calls every Compute and Fused op of
// backend.Ops on a decorator (zero arguments: the hook does not run them)
// and requires the hook to see it under its own name, so that neither the
// tracer nor the profiler can miss an op the model runs.
func TestEveryOpReachesTheHook(t *testing.T) {
	h := seen{}
	o := reflect.ValueOf(Wrap(nil, h))
	for _, name := range backend.OpsOf(backend.Compute, backend.Fused) {
		m := o.MethodByName(name)
		if !m.IsValid() {
			t.Errorf("%s: no such method", name)
			continue
		}
		args := make([]reflect.Value, m.Type().NumIn())
		for i := range args {
			args[i] = reflect.Zero(m.Type().In(i))
		}
		m.Call(args)
		if h[name] != 1 {
			t.Errorf("%s: the hook saw it %d times, want 1", name, h[name])
		}
	}
	if len(h) != len(backend.OpsOf(backend.Compute, backend.Fused)) {
		t.Errorf("the hook saw %d ops: %v", len(h), h)
	}
}
