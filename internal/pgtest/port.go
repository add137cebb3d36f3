package pgtest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Listen ports for servers the tests start are chosen from [PortLow, PortHigh]: below the kernel's
// ephemeral range (Linux: 32768-60999, net.ipv4.ip_local_port_range), from which outgoing connections
// take their local ports. A port picked from that range and bound a moment later may meanwhile be
// held by an outgoing connection (a node once failed to bind its port that way); below it, only
// another listener can take it.
const (
	PortLow  = 20000
	PortHigh = 32767
)

// portTries bounds the random draws of ReservePort before it gives up.
const portTries = 200

// Port is a TCP port on 127.0.0.1 reserved for a server this process is about to start. It was free
// when reserved, and no other process reserving through this package gets it until Release (or until
// this process exits): parallel test binaries never pick the same port. Only the listener that binds
// it (postgres) can take it meanwhile.
type Port struct {
	Number int
	lock   *os.File // flock'ed (exclusive) while reserved; closing it releases
}

// ReservePort picks a random free port in [PortLow, PortHigh] and reserves it. It retries on a port
// that is bound or reserved by another process.
func ReservePort() (*Port, error) {
	var last error
	for range portTries {
		p, err := reservePort(PortLow + rand.IntN(PortHigh-PortLow+1))
		if err == nil {
			return p, nil
		}
		last = err
	}
	return nil, fmt.Errorf("no free TCP port in %d-%d after %d tries (last: %w)", PortLow, PortHigh, portTries, last)
}

// errReserved says another process (or another reservation in this one) holds a port's lock.
var errReserved = errors.New("reserved by another test process")

// reservePort reserves port n if nobody holds its lock and nothing listens on it.
func reservePort(n int) (*Port, error) {
	dir, err := portLockDir()
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(n)), os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("port %d lock: %w", n, err)
	}
	// flock locks belong to the open file: a second open of the same file, in this process or
	// another, conflicts; the kernel drops the lock when the holder exits, however it dies.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("port %d: %w", n, errReserved)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(n)))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("port %d: %w", n, err)
	}
	_ = l.Close()
	return &Port{Number: n, lock: f}, nil
}

// Release gives the port up (safe to call more than once, and on nil).
func (p *Port) Release() {
	if p != nil && p.lock != nil {
		_ = p.lock.Close()
		p.lock = nil
	}
}

// portLockDir is the directory of the per-port lock files, shared by every user running tests on
// the machine (sticky and world-writable, like /tmp).
func portLockDir() (string, error) {
	dir := filepath.Join(os.TempDir(), "notifier-test-ports")
	mode := 0o777 | os.ModeSticky
	err := os.Mkdir(dir, mode)
	if err == nil {
		_ = os.Chmod(dir, mode) // Mkdir's mode is filtered by the umask
	} else if !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("port lock directory: %w", err)
	}
	return dir, nil
}
