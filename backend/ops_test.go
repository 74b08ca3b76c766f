package backend

import (
	"reflect"
	"testing"
)

// TestOpsTable: Ops lists every method of Backend once, in order.
func TestOpsTable(t *testing.T) {
	it := reflect.TypeFor[Backend]()
	want := map[string]bool{}
	for i := range it.NumMethod() {
		want[it.Method(i).Name] = true
	}
	seen := map[string]bool{}
	for _, op := range Ops {
		if seen[op.Name] {
			t.Errorf("op %s listed twice", op.Name)
		}
		seen[op.Name] = true
		if !want[op.Name] {
			t.Errorf("op %s is not a method of Backend", op.Name)
		}
	}
	for m := range want {
		if !seen[m] {
			t.Errorf("Backend method %s is missing from Ops", m)
		}
	}
	if n := len(OpsOf(Compute, Fused)); n == 0 {
		t.Error("no compute ops")
	}
}
