package cuda

import (
	"fmt"
	"unsafe"
)

// TensorMap is an encoded CUtensorMap (128 bytes): the TMA descriptor a
// kernel takes as a __grid_constant__ parameter.
type TensorMap [16]uint64

// Tensor-map element types and swizzles (CUtensorMapDataType, CUtensorMapSwizzle).
const (
	tmaUint8      = 0
	tmaSwizzle128 = 3
)

// HasTMA reports whether this driver can encode tensor maps and the device
// runs the sm_90a TMA/wgmma kernels.
func (c *Context) HasTMA() bool {
	return c.dev.Major == 9 && c.dev.Minor == 0 && c.drv.api.hasTensorMaps() // the device first: plans run on driverless contexts in tests
}

// TensorMapBytes2D describes a row-major byte matrix [rows][cols] at p for
// TMA loads of boxRows x boxCols tiles with the 128-byte swizzle (what wgmma's
// K-major 128B-swizzle descriptors read). cols is the row stride too.
func (c *Context) TensorMapBytes2D(p DevicePtr, rows, cols, boxRows, boxCols int) (TensorMap, error) {
	var m TensorMap
	switch {
	case p%16 != 0 || cols%16 != 0 || rows <= 0 || cols <= 0:
		return m, fmt.Errorf("cuda: tensor map %dx%d at %#x: rows must start on 16 bytes", rows, cols, uint64(p))
	case boxCols != 128 || boxRows < 1 || boxRows > 256:
		return m, fmt.Errorf("cuda: tensor map box %dx%d: 128-byte swizzle needs 128-byte rows", boxRows, boxCols)
	}
	r := c.drv.api.tensorMap2D(c.h, &m, tmaUint8, p, uint64(cols), uint64(rows), uint64(cols), uint32(boxCols), uint32(boxRows), tmaSwizzle128)
	return m, c.check("cuTensorMapEncodeTiled", fmt.Sprintf("%dx%d", rows, cols), r)
}

// TensorMapBytes3D describes a row-major byte matrix [rows][cols] at p as
// [rows][cols/128][128], for TMA loads of boxes of boxRows rows x boxBlocks
// consecutive 128-byte blocks with the 128-byte swizzle: each row brings
// boxBlocks*128 contiguous bytes, and the box lands in shared memory as
// [boxRows][boxBlocks][128] (the swizzle XORs a 16-byte chunk's index with
// the 128-byte line's index mod 8, counted over the whole box).
func (c *Context) TensorMapBytes3D(p DevicePtr, rows, cols, boxRows, boxBlocks int) (TensorMap, error) {
	var m TensorMap
	switch {
	case p%16 != 0 || cols%128 != 0 || rows <= 0 || cols <= 0:
		return m, fmt.Errorf("cuda: tensor map %dx%d at %#x: rows must start on 16 bytes and hold whole 128-byte blocks", rows, cols, uint64(p))
	case boxRows < 1 || boxRows > 256 || boxBlocks < 1 || boxBlocks > 256 || boxBlocks > cols/128:
		return m, fmt.Errorf("cuda: tensor map %dx%d: bad box of %d rows x %d 128-byte blocks", rows, cols, boxRows, boxBlocks)
	}
	dims := [3]uint64{128, uint64(cols / 128), uint64(rows)}
	strides := [2]uint64{128, uint64(cols)}
	box := [3]uint32{128, uint32(boxBlocks), uint32(boxRows)}
	r := c.drv.api.tensorMap3D(c.h, &m, tmaUint8, p, dims, strides, box, tmaSwizzle128)
	return m, c.check("cuTensorMapEncodeTiled", fmt.Sprintf("%dx%d as %dx%dx128, box %dx%dx128", rows, cols, rows, cols/128, boxRows, boxBlocks), r)
}

// Map appends a tensor map (a 128-byte, 64-byte aligned parameter).
func (a *Args) Map(m *TensorMap) *Args {
	if b := a.slot(128, 64); b != nil {
		copy(b, unsafe.Slice((*byte)(unsafe.Pointer(&m[0])), 128))
	}
	return a
}
