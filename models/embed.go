//go:build !noembed

package models

import "embed"

//go:embed small
var small embed.FS

// Embedded says whether this binary carries the default model.
const Embedded = true
