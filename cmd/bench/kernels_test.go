package main

import (
	"io"
	"strings"
	"testing"
)

// TestKernelsBadFlags: bad arguments are refused before any device is opened.
func TestKernelsBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tokens", "0"}, "--tokens"},
		{[]string{"--tokens", "1,x"}, "--tokens"},
		{[]string{"--tokens", "70000"}, "--tokens"},
		{[]string{"--reps", "0"}, "--reps"},
		{[]string{"--model", "mini"}, "--model"},
		{[]string{"--nope"}, "nope"},
		{[]string{"--flush", "clean"}, "--flush"},
		{[]string{"--context", "2"}, "--context"},
		{[]string{"--context", "1x"}, "context"},
		{[]string{"--batch", "0"}, "--batch"},
	} {
		err := runKernels(c.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one naming %s", c.args, err, c.want)
		}
	}
}
