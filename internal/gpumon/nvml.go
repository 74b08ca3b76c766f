//go:build cgo

package gpumon

import (
	"errors"
	"fmt"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Open initialises NVML (it dlopens libnvidia-ml) and returns a Reader over
// every GPU and the function that shuts NVML down. It fails where the library
// or a driver is missing.
func Open() (Reader, func(), error) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("nvml: init: %s", lib.ErrorString(ret))
	}
	closeLib := func() { _ = lib.Shutdown() }
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		closeLib()
		return nil, nil, fmt.Errorf("nvml: device count: %s", lib.ErrorString(ret))
	}
	if n == 0 {
		closeLib()
		return nil, nil, errors.New("nvml: no GPU")
	}
	r := &nvmlReader{lib: lib}
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			closeLib()
			return nil, nil, fmt.Errorf("nvml: GPU %d: %s", i, lib.ErrorString(ret))
		}
		name, ret := d.GetName()
		if ret != nvml.SUCCESS {
			name = ""
		}
		r.devs = append(r.devs, d)
		r.names = append(r.names, name)
	}
	return r, closeLib, nil
}

type nvmlReader struct {
	lib   nvml.Interface
	devs  []nvml.Device
	names []string
}

func (r *nvmlReader) Devices() int { return len(r.devs) }

// Read takes the memory figures (required) and what else the device reports.
func (r *nvmlReader) Read(i int) (Sample, error) {
	d := r.devs[i]
	s := Sample{Name: r.names[i], Util: math.NaN(), PowerW: math.NaN(), TempC: math.NaN()}
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return Sample{}, fmt.Errorf("nvml: GPU %d memory: %s", i, r.lib.ErrorString(ret))
	}
	s.MemUsed, s.MemTotal = float64(mem.Used), float64(mem.Total)
	if u, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS {
		s.Util = float64(u.Gpu) / 100
	}
	if mw, ret := d.GetPowerUsage(); ret == nvml.SUCCESS {
		s.PowerW = float64(mw) / 1000
	}
	if t, ret := d.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		s.TempC = float64(t)
	}
	return s, nil
}
