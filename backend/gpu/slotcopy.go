package gpu

import (
	"github.com/megamoe/megamoe/cuda"
)

// slotBuffers lists the store's slot-major buffers ([MaxSlots][per-slot
// bytes]): everything a state slot holds, in whatever format it is kept. A
// new per-slot buffer must be listed here (opcheck's copy slot case).
func (k *kvStore) slotBuffers() []*cuda.Buffer {
	var bufs []*cuda.Buffer
	for i := range k.layers {
		kl := &k.layers[i]
		bufs = append(bufs, kl.win)
		for _, c := range []compBufs{kl.comp, kl.idx} {
			if c.a != nil {
				bufs = append(bufs, c.a, c.z)
			}
		}
	}
	return bufs
}
