//go:build race

package codec

// raceEnabled: the race detector's sync.Pool drops items at random and its instrumentation
// allocates, so allocation counts mean nothing under it.
const raceEnabled = true
