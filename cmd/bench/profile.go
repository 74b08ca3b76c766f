package main

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/megamoe/megamoe/backend/observe"
)

// timedBackend is the observe.Hook of --profile: it charges the wall time of
// every op, synchronised before and after (sync), to the op's key (linears
// by weight name without the layer index, and shape). The model runs on the
// decorated backend, so the profile holds the ops the served path issues,
// fused ones included; timing serialises the device (no side stream, no
// graph replay), so a profiled step is slower than a plain one: the shares,
// not the sum, are the reading.
type timedBackend struct {
	sync  func() error
	total map[string]time.Duration
	calls map[string]int
	err   error // first sync failure
}

func newTimed(sync func() error) *timedBackend {
	return &timedBackend{sync: sync, total: map[string]time.Duration{}, calls: map[string]int{}}
}

func (t *timedBackend) reset() { clear(t.total); clear(t.calls) }

// Op implements observe.Hook: it runs the op between two syncs.
func (t *timedBackend) Op(c *observe.Call, run func() error) error {
	if err := t.sync(); err != nil && t.err == nil {
		t.err = err
	}
	t0 := time.Now()
	err := run()
	if serr := t.sync(); serr != nil && t.err == nil {
		t.err = serr
	}
	t.total[c.Key] += time.Since(t0)
	t.calls[c.Key]++
	return err
}

// print writes the ops by total time over steps steps, with the share of wall.
func (t *timedBackend) print(out io.Writer, what string, steps int, wall time.Duration) {
	type row struct {
		name string
		d    time.Duration
	}
	var rows []row
	var sum time.Duration
	for k, d := range t.total {
		rows = append(rows, row{k, d})
		sum += d
	}
	slices.SortFunc(rows, func(a, b row) int { return int(b.d - a.d) })
	fmt.Fprintf(out, "profile %s: %d steps, %.3f ms/step wall (profiled), ops %.3f ms/step, host and transfers %.3f ms/step\n",
		what, steps, ms(wall)/float64(steps), ms(sum)/float64(steps), ms(wall-sum)/float64(steps))
	for _, r := range rows {
		fmt.Fprintf(out, "  %-58s %8.3f ms/step %5.1f%%  %6.1f calls/step\n", r.name, ms(r.d)/float64(steps),
			100*float64(r.d)/float64(max(wall, 1)), float64(t.calls[r.name])/float64(steps))
	}
}
