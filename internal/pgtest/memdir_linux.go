package pgtest

import (
	"os"
	"syscall"
)

// tmpfsMagic is Linux's f_type of a tmpfs (linux/magic.h).
const tmpfsMagic = 0x01021994

// memoryDir is where a tests' cluster may live in memory.
const memoryDir = "/dev/shm"

// memoryBase returns memoryDir when the tests' cluster may live there, else "": a tmpfs with room
// (tmpfsWithRoom), traversable by the server's user (otherUser), and not turned off by PGTEST_TMPFS.
func memoryBase(otherUser bool) string {
	if os.Getenv("PGTEST_TMPFS") == "off" || !tmpfsWithRoom(memoryDir) {
		return ""
	}
	if otherUser && !traversable(memoryDir) {
		return ""
	}
	return memoryDir
}

// tmpfsWithRoom says whether dir is on a tmpfs with at least minMemoryFree bytes free.
func tmpfsWithRoom(dir string) bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil || int64(st.Type) != tmpfsMagic {
		return false
	}
	return st.Bavail*uint64(st.Bsize) >= minMemoryFree
}
