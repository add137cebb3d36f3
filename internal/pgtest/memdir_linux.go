package pgtest

import (
	"os"
	"syscall"
)

// tmpfsMagic is Linux's f_type of a tmpfs (linux/magic.h).
const tmpfsMagic = 0x01021994

// memoryBase returns /dev/shm when the tests' cluster may live there, else "": it must be a tmpfs,
// traversable by the server's user (otherUser), with at least minMemoryFree bytes free.
func memoryBase(otherUser bool) string {
	const dir = "/dev/shm"
	if os.Getenv("PGTEST_TMPFS") == "off" {
		return ""
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil || int64(st.Type) != tmpfsMagic {
		return ""
	}
	if st.Bavail*uint64(st.Bsize) < minMemoryFree {
		return ""
	}
	if otherUser && !traversable(dir) {
		return ""
	}
	return dir
}
