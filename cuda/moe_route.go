package cuda

import "fmt"

// MoERouteArgs are the operands of MoERoute: MoEPermute's, MoETiles's and
// MoEGatherQuant's.
type MoERouteArgs struct {
	IDs                        DevicePtr // int32 [Pairs]: the expert of every (row, slot) pair
	Pairs, Experts             int       //
	Counts, Offsets, Perm, Inv DevicePtr // as MoEPermute's
	Tiles                      DevicePtr // MoETiles's scratch, MoEScratchBytes(Shape); 0: no tile list (exact)
	Shape                      MoEShape  // a grouped GEMM the tile list serves (Experts, Rows = Pairs)
	XQ, XS, XG, X              DevicePtr // as MoEGatherQuant's; X 0: no gather
	K, D                       int       // slots per row, row width (% 128 == 0)
}

// MoERoute sorts the pairs into expert order (MoEPermute), gathers and
// quantises their rows (MoEGatherQuant, X set) and writes the tile list of
// the GEMMs (MoETiles, Tiles set): a step's routing bookkeeping before the
// grouped expert GEMMs. (One CTA doing all of it is slower: the separate
// kernels spread the sort and the gather over the SMs.)
func MoERoute(s *Stream, a MoERouteArgs) (MoETileList, error) {
	if err := a.check(); err != nil {
		return MoETileList{}, err
	}
	if err := MoEPermute(s, a.IDs, a.Pairs, a.Experts, a.Counts, a.Offsets, a.Perm, a.Inv); err != nil {
		return MoETileList{}, err
	}
	if a.X != 0 {
		if err := MoEGatherQuant(s, a.XQ, a.XS, a.XG, a.X, a.Perm, a.Offsets, a.Experts, a.K, a.D, a.Pairs); err != nil {
			return MoETileList{}, err
		}
	}
	if a.Tiles == 0 {
		return MoETileList{}, nil
	}
	tl, err := MoETiles(s, a.Offsets, a.Shape, a.Tiles)
	if a.X != 0 {
		// The gather ran between the offsets' writer and the GEMMs.
		tl = tl.Settled()
	}
	return tl, err
}

func (a *MoERouteArgs) check() error {
	if a.Pairs < 0 || a.Experts <= 0 || a.Experts > 1<<20 {
		return fmt.Errorf("cuda: moe_route: bad shape pairs=%d experts=%d", a.Pairs, a.Experts)
	}
	if a.X != 0 && (a.K <= 0 || a.D <= 0 || a.D%128 != 0 || (a.XQ == 0) != (a.XS == 0) || (a.XQ == 0 && a.XG == 0)) {
		return fmt.Errorf("cuda: moe_route: bad gather k=%d d=%d (d %% 128 == 0; codes with scales, or rows)", a.K, a.D)
	}
	if a.Tiles != 0 {
		if err := checkMoEShape(a.Shape); err != nil {
			return fmt.Errorf("cuda: moe_route: %w", err)
		}
		if a.Shape.Experts != a.Experts || a.Shape.Rows != a.Pairs {
			return fmt.Errorf("cuda: moe_route: tile list for %+v, not %d pairs over %d experts", a.Shape, a.Pairs, a.Experts)
		}
	}
	return nil
}
