// Package gpumon exports the GPUs' memory, utilisation, power and
// temperature as Prometheus gauges, read through NVML when the machine has it.
package gpumon

import (
	"math"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Sample is one GPU's state; a quantity the device does not report is NaN.
type Sample struct {
	Name              string
	MemUsed, MemTotal float64 // bytes
	Util              float64 // busy fraction of the last sample period, 0..1
	PowerW, TempC     float64
}

// Reader reads the GPUs' state (NVML: Open).
type Reader interface {
	Devices() int
	Read(i int) (Sample, error)
}

// Collector is a prometheus.Collector over a Reader: each scrape reads every
// device; a device that cannot be read is left out of that scrape.
type Collector struct {
	r     Reader
	descs []*prometheus.Desc // in gauge order
}

var gauges = []struct {
	name, help string
	get        func(Sample) float64
}{
	{"megamoe_gpu_memory_used_bytes", "GPU memory in use (by every process).", func(s Sample) float64 { return s.MemUsed }},
	{"megamoe_gpu_memory_total_bytes", "GPU memory.", func(s Sample) float64 { return s.MemTotal }},
	{"megamoe_gpu_utilization_ratio", "Fraction of the last sample period the GPU was busy.", func(s Sample) float64 { return s.Util }},
	{"megamoe_gpu_power_watts", "GPU power draw.", func(s Sample) float64 { return s.PowerW }},
	{"megamoe_gpu_temperature_celsius", "GPU temperature.", func(s Sample) float64 { return s.TempC }},
}

// NewCollector returns the gauges of r's devices, labelled by index and name.
func NewCollector(r Reader) *Collector {
	c := &Collector{r: r}
	for _, g := range gauges {
		c.descs = append(c.descs, prometheus.NewDesc(g.name, g.help, []string{"gpu", "name"}, nil))
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for i := range c.r.Devices() {
		s, err := c.r.Read(i)
		if err != nil {
			continue
		}
		for j, g := range gauges {
			v := g.get(s)
			if math.IsNaN(v) {
				continue
			}
			ch <- prometheus.MustNewConstMetric(c.descs[j], prometheus.GaugeValue, v, strconv.Itoa(i), s.Name)
		}
	}
}
