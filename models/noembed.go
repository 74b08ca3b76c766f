//go:build noembed

package models

import "embed"

// Built with -tags noembed, a binary is 13 MB smaller and loads its model
// from a directory (--model DIR) only.
var small embed.FS

// Embedded says whether this binary carries the default model.
const Embedded = false
