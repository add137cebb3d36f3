//go:build !linux

package pgha

// Without /proc a node's processes cannot be found: Start works, KillPrimary kills only pg_autoctl's
// supervisor (its postgres lives on), and Close cannot look for strays.

func descendants(int) []int { return nil }

func zombie(int) bool { return false }

func processesNaming(string) []int { return nil }
