package api

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/internal/gpumon"
	"github.com/prometheus/client_golang/prometheus"
)

type oneGPU struct{}

func (oneGPU) Devices() int { return 1 }
func (oneGPU) Read(int) (gpumon.Sample, error) {
	return gpumon.Sample{Name: "GPU", MemUsed: 5e9, MemTotal: 8e9, Util: 0.25, PowerW: 100, TempC: 50}, nil
}

// Config.Collectors' series appear on /metrics; without them (a machine
// without NVML) there is no GPU series.
func TestGPUMetrics(t *testing.T) {
	for _, tc := range []struct {
		name       string
		collectors []prometheus.Collector
		want       []string
	}{
		{"no NVML", nil, nil},
		{"one GPU", []prometheus.Collector{gpumon.NewCollector(oneGPU{})}, []string{
			`megamoe_gpu_memory_used_bytes{gpu="0",name="GPU"} 5e+09`,
			`megamoe_gpu_memory_total_bytes{gpu="0",name="GPU"} 8e+09`,
			`megamoe_gpu_utilization_ratio{gpu="0",name="GPU"} 0.25`,
			`megamoe_gpu_power_watts{gpu="0",name="GPU"} 100`,
			`megamoe_gpu_temperature_celsius{gpu="0",name="GPU"} 50`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _ := startServer(t, Config{Collectors: tc.collectors}, 0)
			resp, err := http.Get(srv.URL + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			data, _ := io.ReadAll(resp.Body)
			text := string(data)
			if tc.want == nil && strings.Contains(text, "_gpu_") {
				t.Errorf("GPU series without a collector:\n%s", text)
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w+"\n") {
					t.Errorf("/metrics lacks %s", w)
				}
			}
		})
	}
}
