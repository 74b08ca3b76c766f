package testctx

import (
	"testing"
)

func TestNew(t *testing.T) {
	ctx := New(t)
	tdl, tok := t.Deadline()
	cdl, cok := ctx.Deadline()
	if tok != cok {
		t.Fatalf("test deadline set %v, context deadline set %v", tok, cok)
	}
	if tok && !cdl.Before(tdl) {
		t.Errorf("context deadline %v is not before the test's %v", cdl, tdl)
	}
	if err := ctx.Err(); err != nil {
		t.Errorf("fresh context already done: %v", err)
	}
}
