package main

import (
	"log/slog"

	"github.com/megamoe/megamoe/internal/gpumon"
	"github.com/prometheus/client_golang/prometheus"
)

// gpuCollectors returns the GPU gauges for /metrics and the function that
// releases NVML; none where NVML cannot be opened (a machine without an
// NVIDIA driver).
func gpuCollectors(open func() (gpumon.Reader, func(), error), log *slog.Logger) ([]prometheus.Collector, func()) {
	r, closeFn, err := open()
	if err != nil {
		log.Info("no GPU gauges on /metrics", "reason", err)
		return nil, func() {}
	}
	return []prometheus.Collector{gpumon.NewCollector(r)}, closeFn
}
