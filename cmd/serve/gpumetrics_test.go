package main

import (
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/megamoe/megamoe/internal/gpumon"
)

type fakeGPUs int

func (n fakeGPUs) Devices() int                  { return int(n) }
func (fakeGPUs) Read(int) (gpumon.Sample, error) { return gpumon.Sample{MemTotal: 1}, nil }

// The GPU gauges are there when NVML opens and absent when it does not.
func TestGPUCollectors(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name string
		open func() (gpumon.Reader, func(), error)
		want int
	}{
		{"no NVML", func() (gpumon.Reader, func(), error) {
			return nil, nil, errors.New("nvml: init: ERROR_LIBRARY_NOT_FOUND")
		}, 0},
		{"NVML", func() (gpumon.Reader, func(), error) { return fakeGPUs(2), func() {}, nil }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, closeFn := gpuCollectors(tc.open, log)
			defer closeFn()
			if len(cs) != tc.want {
				t.Fatalf("%d collectors, want %d", len(cs), tc.want)
			}
		})
	}
}
