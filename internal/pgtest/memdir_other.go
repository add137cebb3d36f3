//go:build !linux

package pgtest

// memoryBase finds no tmpfs outside Linux: the tests' cluster stays in os.TempDir().
func memoryBase(otherUser bool) string { return "" }
