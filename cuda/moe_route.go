package cuda

import "fmt"

// MoERoute: a step's routing bookkeeping before the grouped expert GEMMs, by
// the separate kernels or, opted in (KernelChoice.MoERouteSmall), in one
// launch of moe_route_small (kernels/moe_route.cu) where the step is small.
// The one launch measured slower on the H200 (2026-12-05: 15.7 us a layer
// under ncu against about 12 for the four it replaces; batch-1 decode of the
// Flash 4-layer stack 1.36-1.38 ms with it, 1.33-1.34 ms without), so it is
// off by default: a single CTA of serial ballot loops.

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

const (
	// routeSmallMax is moe_route_small's CTA (ROUTE_THREADS): at most that many
	// pairs and experts.
	routeSmallMax = 1024
	// routeSmallGather bounds the (row, 128-column block) pairs moe_route_small
	// gathers itself, 8 a warp (batch 1 on Flash: 6 rows × 32 blocks); more
	// rows take moe_gather_q's full grid. To be timed on the H200.
	routeSmallGather = 256
)

// MoERouteSmallFits reports whether moe_route_small takes a step of pairs
// (row, slot) pairs over experts (MoERoute takes it there when opted in).
func MoERouteSmallFits(pairs, experts int) bool {
	return pairs >= 1 && pairs <= routeSmallMax && experts >= 1 && experts <= routeSmallMax
}

// MoERoute sorts the pairs into expert order (MoEPermute), gathers and
// quantises their rows (MoEGatherQuant, X set) and writes the tile list of
// the GEMMs (MoETiles, Tiles set), all bit for bit as those launchers, in
// one moe_route_small launch where opted in and MoERouteSmallFits (plus
// moe_gather_q past routeSmallGather row blocks); else by the three.
func MoERoute(s *Stream, a MoERouteArgs) (MoETileList, error) {
	if err := a.check(); err != nil {
		return MoETileList{}, err
	}
	if s.ctx.kernelChoice().MoERouteSmall && MoERouteSmallFits(a.Pairs, a.Experts) {
		return moeRouteSmall(s, a)
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
	return MoETiles(s, a.Offsets, a.Shape, a.Tiles)
}

// MoERouteSmall is MoERoute through moe_route_small whatever the step's
// size (tests); it fails where MoERouteSmallFits does not hold.
func MoERouteSmall(s *Stream, a MoERouteArgs) (MoETileList, error) {
	if err := a.check(); err != nil {
		return MoETileList{}, err
	}
	if !MoERouteSmallFits(a.Pairs, a.Experts) {
		return MoETileList{}, fmt.Errorf("cuda: moe_route_small: %d pairs over %d experts (1 to %d each)", a.Pairs, a.Experts, routeSmallMax)
	}
	return moeRouteSmall(s, a)
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

func moeRouteSmall(s *Stream, a MoERouteArgs) (MoETileList, error) {
	var tl MoETileList
	tiles := a.Tiles
	if tiles != 0 {
		// The plan of the GEMMs that will read the list (path, forced tile).
		p := s.moePlan(a.Shape)
		if p.maxTiles > 65535 {
			return tl, fmt.Errorf("cuda: moe_route_small: %d rows exceed the grid limit", a.Pairs)
		}
		tl = MoETileList{offsets: a.Offsets, bm: p.bm, maxTiles: p.maxTiles}
	}
	gather := a.X != 0 && a.Pairs*(a.D/128) <= routeSmallGather
	var xq, xs, xg, x DevicePtr
	if gather {
		xq, xs, xg, x = a.XQ, a.XS, a.XG, a.X
	}
	args := new(Args).Ptr(a.IDs).I32(a.Pairs).I32(a.Experts).Ptr(a.Counts).Ptr(a.Offsets).Ptr(a.Perm).Ptr(a.Inv).
		Ptr(tiles).I32(tl.maxTiles).I32(tl.bm).Ptr(xq).Ptr(xs).Ptr(xg).Ptr(x).I32(a.K).I32(a.D)
	if err := launch(s, "moe_route", "moe_route_small", Dim3{1, 1, 1}, Dim3{routeSmallMax, 1, 1}, 0, args); err != nil {
		return MoETileList{}, err
	}
	if a.X != 0 && !gather {
		if err := MoEGatherQuant(s, a.XQ, a.XS, a.XG, a.X, a.Perm, a.Offsets, a.Experts, a.K, a.D, a.Pairs); err != nil {
			return MoETileList{}, err
		}
	}
	return tl, nil
}
