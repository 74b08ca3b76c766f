package cpu

// copyFrom copies every buffer of a layer's state; a new field of layerState
// must be copied here too (TestCopySlot compares whole slots).
func (l *layerState) copyFrom(src *layerState) {
	copy(l.win, src.win)
	copy(l.winC, src.winC)
	copy(l.comp.A, src.comp.A)
	copy(l.comp.Z, src.comp.Z)
	copy(l.idx.A, src.idx.A)
	copy(l.idx.Z, src.idx.Z)
}
