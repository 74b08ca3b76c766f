// Package testctx gives tests a context to bound their waits by: it ends
// shortly before the test binary's -timeout would, so a test that waits for
// something that never comes fails with its own message instead of the
// timeout's goroutine dump, and no test waits by a wall-clock guess that a
// loaded machine can miss.
package testctx

import (
	"context"
	"testing"
	"time"
)

// New returns t.Context(), cut off a grace period before t's deadline (5 % of
// the time left, at least a second) when the test binary has one.
func New(t *testing.T) context.Context {
	ctx := t.Context()
	dl, ok := t.Deadline()
	if !ok {
		return ctx
	}
	grace := max(time.Until(dl)/20, time.Second)
	ctx, cancel := context.WithDeadline(ctx, dl.Add(-grace))
	t.Cleanup(cancel)
	return ctx
}
