package pgtest

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// Ports come from below the kernel's ephemeral range, are distinct while held, and come back once
// released.
func TestReservePortBelowEphemeralRange(t *testing.T) {
	is := is.New(t)
	seen := map[int]bool{}
	var held []*Port
	for range 50 {
		p, err := ReservePort()
		is.NoErr(err)
		held = append(held, p)
		is.True(p.Number >= PortLow && p.Number <= PortHigh) // in the range below 32768
		is.True(p.Number < 32768)                            // never the kernel's ephemeral range
		is.True(!seen[p.Number])                             // a held port is never handed out twice
		seen[p.Number] = true
	}
	p := held[0]
	_, err := reservePort(p.Number)
	is.True(errors.Is(err, errReserved)) // a second reservation of a held port is refused
	p.Release()
	p.Release() // idempotent
	again, err := reservePort(p.Number)
	is.NoErr(err) // a released port can be reserved again
	again.Release()
	for _, p := range held[1:] {
		p.Release()
	}
}

// A port something listens on is never reserved.
func TestReservePortSkipsBoundPort(t *testing.T) {
	is := is.New(t)
	p, err := ReservePort()
	is.NoErr(err)
	n := p.Number
	p.Release()
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(n)))
	if err != nil {
		t.Skipf("port %d was taken meanwhile: %v", n, err)
	}
	defer l.Close()
	_, err = reservePort(n)
	is.True(err != nil)                                     // a bound port is refused
	is.True(!errors.Is(err, errReserved))                   // for being bound, not for its lock
	is.True(strings.Contains(err.Error(), strconv.Itoa(n))) // the error names the port
}

// Another test binary holding a port keeps it: the reservation works across processes, and ends with
// the process that held it.
func TestReservePortAcrossProcesses(t *testing.T) {
	if os.Getenv("PGTEST_HOLD_PORT") != "" {
		return // the helper's part runs in TestMain's child below
	}
	is := is.New(t)
	p, err := ReservePort()
	is.NoErr(err)
	n := p.Number
	p.Release()
	// A child process (this test binary) reserves n and waits for its stdin to close.
	cmd := exec.Command(os.Args[0], "-test.run=^TestReservePortHelper$")
	cmd.Env = append(os.Environ(), "PGTEST_HOLD_PORT="+strconv.Itoa(n))
	stdin, err := cmd.StdinPipe()
	is.NoErr(err)
	out, err := cmd.StdoutPipe()
	is.NoErr(err)
	is.NoErr(cmd.Start())
	buf := make([]byte, 64)
	k, _ := out.Read(buf)
	is.True(strings.Contains(string(buf[:k]), "held")) // the child reserved the port
	_, err = reservePort(n)
	is.True(errors.Is(err, errReserved)) // held by the other process
	stdin.Close()
	_ = cmd.Wait()
	again, err := reservePort(n)
	is.NoErr(err) // free again once the holder has exited
	again.Release()
}

// TestReservePortHelper is TestReservePortAcrossProcesses's child: it holds the port of
// PGTEST_HOLD_PORT until its stdin closes.
func TestReservePortHelper(t *testing.T) {
	v := os.Getenv("PGTEST_HOLD_PORT")
	if v == "" {
		t.Skip("helper process of TestReservePortAcrossProcesses")
	}
	n, _ := strconv.Atoi(v)
	p, err := reservePort(n)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	os.Stdout.WriteString("held\n")
	_, _ = os.Stdin.Read(make([]byte, 1))
}

// The harness's own cluster listens below the ephemeral range.
func TestClusterPortBelowEphemeralRange(t *testing.T) {
	srv := Cluster()
	if srv == nil {
		t.Skip("using an external database server")
	}
	is := is.New(t)
	is.True(srv.Port() >= PortLow && srv.Port() <= PortHigh) // the cluster's port is below 32768
}
