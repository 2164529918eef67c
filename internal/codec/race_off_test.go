//go:build !race

package codec

// raceEnabled: see race_on_test.go.
const raceEnabled = false
