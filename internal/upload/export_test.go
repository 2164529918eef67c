package upload

import "os"

// SetPunchHole replaces the hole puncher (a file system that cannot punch holes, in tests)
// and returns the function that puts the real one back.
func SetPunchHole(f func(*os.File, int64, int64) error) (restore func()) {
	old := punchHole
	punchHole = f
	return func() { punchHole = old }
}
