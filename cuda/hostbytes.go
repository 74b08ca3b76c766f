package cuda

import "unsafe"

// Bytes views a slice of numbers as its bytes, without a copy: the host side
// of a device copy. The kernels assume little-endian data, as every platform
// this package builds for is.
func Bytes[T ~uint8 | ~uint16 | ~int32 | ~uint32 | ~float32](v []T) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*int(unsafe.Sizeof(v[0])))
}
