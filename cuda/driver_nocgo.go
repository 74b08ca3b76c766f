//go:build !cgo

package cuda

// Without cgo there is no way to call into libcuda: the loaders report it.

func openDriver() (driverAPI, error) { return nil, ErrNoCGO }

func openNVRTC() (nvrtcAPI, error) { return nil, ErrNoCGO }

func openNCCL() (ncclAPI, error) { return nil, ErrNoCGO }
