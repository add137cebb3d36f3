package pgtest

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/matryer/is"
)

func TestTestClusterLivesOnTmpfsUnlessTurnedOff(t *testing.T) {
	is := is.New(t)
	// Checked here on its own, not with tmpfsWithRoom: a tmpfsWithRoom that always said no would
	// otherwise skip this test instead of failing it.
	var st syscall.Statfs_t
	if err := syscall.Statfs(memoryDir, &st); err != nil || int64(st.Type) != tmpfsMagic || st.Bavail*uint64(st.Bsize) < minMemoryFree {
		t.Skip("no tmpfs with room at " + memoryDir + " here")
	}
	if os.Getenv("PGTEST_TMPFS") == "off" || os.Getenv("TEST_DATABASE_URL") != "" || os.Getenv("DATABASE_URL") != "" {
		t.Skip("the tests' cluster is not a throwaway one on a tmpfs in this run")
	}
	NewDB(t) // the harness's throwaway cluster is up
	stateMu.Lock()
	dir := state.server.dir
	stateMu.Unlock()
	is.True(strings.HasPrefix(dir, memoryDir+"/"+tempPrefix)) // the tests' cluster is on the tmpfs
	is.Equal(memoryBase(false), memoryDir)                    // a tmpfs with room is chosen

	t.Setenv("PGTEST_TMPFS", "off")
	is.Equal(memoryBase(false), "") // turned off: the cluster stays in os.TempDir()
}
