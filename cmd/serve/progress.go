package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// isTerminal reports whether f is a character device (a TTY).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// barWidth is the width of the bar itself, between the brackets.
const barWidth = 30

// renderBar is one progress line: a bar of done/total, the counts, what is
// being done and the time so far.
func renderBar(done, total int, label string, elapsed time.Duration) string {
	if total < 1 {
		total = 1
	}
	done = min(max(done, 0), total)
	fill := done * barWidth / total
	return fmt.Sprintf("[%s%s] %d/%d %s %s", strings.Repeat("=", fill), strings.Repeat(" ", barWidth-fill),
		done, total, label, elapsed.Round(100*time.Millisecond))
}

// progress draws a one-line, \r-updated bar of the loading stages on a
// terminal; it redraws on a timer so that the elapsed time moves during a long
// stage. The model and checkpoint packages report no progress within a stage,
// so the bar counts stages, not bytes. A nil *progress draws nothing.
type progress struct {
	w     io.Writer
	total int
	start time.Time

	mu    sync.Mutex
	done  int
	label string
	stop  chan struct{}
	wg    sync.WaitGroup
}

// newProgress starts a bar of total stages on w, or returns nil when w is not a terminal.
func newProgress(w io.Writer, total int) *progress {
	f, ok := w.(*os.File)
	if !ok || !isTerminal(f) {
		return nil
	}
	return startProgress(w, total)
}

// startProgress starts a bar on w, terminal or not.
func startProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total, start: time.Now(), stop: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
				p.mu.Lock()
				p.draw()
				p.mu.Unlock()
			}
		}
	}()
	return p
}

// stage marks the previous stage done and starts the next one.
func (p *progress) stage(label string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.label != "" {
		p.done++
	}
	p.label = label
	p.draw()
}

// finish completes the bar (ok) or leaves it where it failed, and ends the line.
func (p *progress) finish(ok bool) {
	if p == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if ok {
		p.done, p.label = p.total, "loaded"
	}
	p.draw()
	fmt.Fprintln(p.w)
}

// draw rewrites the line; \x1b[K clears what a longer previous line left.
func (p *progress) draw() {
	fmt.Fprintf(p.w, "\r%s\x1b[K", renderBar(p.done, p.total, p.label, time.Since(p.start)))
}
