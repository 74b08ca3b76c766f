package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/gpu"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
)

// opReporter implements opcheck.Reporter for the command: Fatalf aborts the
// current op group (CheckOps recovers opcheck.Abort and records a failed row),
// Errorf is printed (the row itself carries the failure), Logf only with -v.
type opReporter struct {
	verbose bool
	t0      time.Time
}

func (r *opReporter) Helper() {}

func (r *opReporter) Logf(format string, args ...any) {
	if r.verbose {
		fmt.Printf("      "+format+"\n", args...)
	}
}

func (r *opReporter) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "      error: "+format+"\n", args...)
}

func (r *opReporter) Fatalf(format string, args ...any) {
	panic(opcheck.Abort{Msg: fmt.Sprintf(format, args...)})
}

// Row prints each row as its op group finishes (opcheck.RowSink).
func (r *opReporter) Row(row opcheck.Row) {
	fmt.Printf("%s  [%.1fs]\n", opcheck.FormatRow(row), time.Since(r.t0).Seconds())
}

// checkOps runs opcheck.CheckOps for every model (faithful, and exact if asked).
func checkOps(ordinal int, models []string, exact bool, filter string, seed uint64, verbose bool) error {
	b, err := gpu.New(gpu.Options{Device: ordinal})
	if err != nil {
		return err
	}
	defer b.Close()
	modes := []backend.Numerics{backend.Faithful}
	if exact {
		modes = append(modes, backend.Exact)
	}
	fmt.Printf("\nbackend ops GPU vs CPU on %s, seed %d\n", b.Name(), seed)
	var rows []opcheck.Row
	for _, name := range models {
		var d opcheck.OpDims
		switch strings.TrimSpace(name) {
		case "flash":
			d = opcheck.FlashDims()
		case "pro":
			d = opcheck.ProDims()
		default:
			return fmt.Errorf("unknown model %q (flash, pro)", name)
		}
		for _, m := range modes {
			rep := &opReporter{verbose: verbose, t0: time.Now()}
			rows = append(rows, opcheck.CheckOps(b, d, m, seed, filter, rep)...)
		}
	}
	failed := 0
	fmt.Println("\nops summary")
	for _, r := range rows {
		fmt.Println(opcheck.FormatRow(r))
		if !r.Pass {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d op comparisons failed", failed, len(rows))
	}
	fmt.Printf("all %d op comparisons passed\n", len(rows))
	return nil
}
