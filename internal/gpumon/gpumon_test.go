package gpumon

import (
	"errors"
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeReader serves fixed samples; a nil entry fails to read.
type fakeReader []*Sample

func (f fakeReader) Devices() int { return len(f) }
func (f fakeReader) Read(i int) (Sample, error) {
	if f[i] == nil {
		return Sample{}, errors.New("gone")
	}
	return *f[i], nil
}

func TestCollector(t *testing.T) {
	h100 := &Sample{Name: "H100", MemUsed: 70e9, MemTotal: 80e9, Util: 0.5, PowerW: 600, TempC: 61}
	noPower := &Sample{Name: "A100", MemUsed: 1e9, MemTotal: 40e9, Util: 0, PowerW: math.NaN(), TempC: 40}
	for _, tc := range []struct {
		name string
		r    fakeReader
		want map[string]float64 // "metric gpu" -> value
	}{
		{"none", fakeReader{}, map[string]float64{}},
		{"two GPUs, one without power", fakeReader{h100, noPower}, map[string]float64{
			"megamoe_gpu_memory_used_bytes 0": 70e9, "megamoe_gpu_memory_total_bytes 0": 80e9,
			"megamoe_gpu_utilization_ratio 0": 0.5, "megamoe_gpu_power_watts 0": 600, "megamoe_gpu_temperature_celsius 0": 61,
			"megamoe_gpu_memory_used_bytes 1": 1e9, "megamoe_gpu_memory_total_bytes 1": 40e9,
			"megamoe_gpu_utilization_ratio 1": 0, "megamoe_gpu_temperature_celsius 1": 40,
		}},
		{"unreadable GPU left out", fakeReader{nil, h100}, map[string]float64{
			"megamoe_gpu_memory_used_bytes 1": 70e9, "megamoe_gpu_memory_total_bytes 1": 80e9,
			"megamoe_gpu_utilization_ratio 1": 0.5, "megamoe_gpu_power_watts 1": 600, "megamoe_gpu_temperature_celsius 1": 61,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			if err := reg.Register(NewCollector(tc.r)); err != nil {
				t.Fatal(err)
			}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, mf := range mfs {
				for _, m := range mf.GetMetric() {
					labels := map[string]string{}
					for _, l := range m.GetLabel() {
						labels[l.GetName()] = l.GetValue()
					}
					if want := tc.r[labels["gpu"][0]-'0']; want == nil || labels["name"] != want.Name {
						t.Errorf("%s: labels %v", mf.GetName(), labels)
					}
					got[mf.GetName()+" "+labels["gpu"]] = m.GetGauge().GetValue()
				}
			}
			if len(got) != len(tc.want) {
				t.Errorf("%d series, want %d: %v", len(got), len(tc.want), got)
			}
			for k, v := range tc.want {
				if g, ok := got[k]; !ok || g != v {
					t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
				}
			}
		})
	}
}

// Open either works (a machine with NVML and a GPU) or says why not; it
// never panics, and on this build's CPU-only machines it fails.
func TestOpen(t *testing.T) {
	r, closeFn, err := Open()
	if err != nil {
		t.Logf("no NVML: %v", err)
		return
	}
	defer closeFn()
	if r.Devices() == 0 {
		t.Fatal("NVML opened with no device")
	}
	s, err := r.Read(0)
	if err != nil {
		t.Fatal(err)
	}
	if s.MemTotal <= 0 || s.MemUsed < 0 || s.MemUsed > s.MemTotal {
		t.Fatalf("GPU 0 memory %v of %v", s.MemUsed, s.MemTotal)
	}
}
