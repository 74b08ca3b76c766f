package kcheck

import "testing"

// TestParseFlush: the --flush values and a clear error for others.
func TestParseFlush(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Flush
		ok   bool
	}{
		{"write", FlushWrite, true}, {"read", FlushRead, true}, {"", 0, false}, {"Read", 0, false}, {"clean", 0, false},
	} {
		got, err := ParseFlush(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseFlush(%q) = %v, %v; want %v, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
}
