//go:build !cgo

package gpumon

import "errors"

// Open fails: NVML is reached through cgo, which this build lacks.
func Open() (Reader, func(), error) {
	return nil, nil, errors.New("nvml: built without cgo")
}
