//go:build linux

package proc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Server measures a PostgreSQL server on this machine: the CPU time (user + system) used so far by
// the postmaster and all its processes, backends that have exited included (their time is in the
// postmaster's cutime/cstime once reaped).
type Server struct{ postmaster int }

// clockTicks is USER_HZ, the unit of /proc/PID/stat times: 100 on every Linux platform Go supports.
const clockTicks = 100

// NewServer finds the postmaster from one of its backends; an error when PostgreSQL runs elsewhere
// (or /proc is not readable).
func NewServer(backendPID int) (*Server, error) {
	f, err := procStat(backendPID)
	if err != nil {
		return nil, fmt.Errorf("the server's backend %d is not a process here: %w", backendPID, err)
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return nil, fmt.Errorf("/proc/%d/stat: %w", backendPID, err)
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", ppid))
	if err != nil || !strings.Contains(string(cmd), "postgres") {
		return nil, fmt.Errorf("the parent of backend %d is not a postmaster here", backendPID)
	}
	return &Server{postmaster: ppid}, nil
}

// Used is the server's CPU time so far. The postmaster is read before its children: a child reaped in
// between is missed (undercount) rather than counted twice.
func (s *Server) Used() (time.Duration, error) {
	f, err := procStat(s.postmaster)
	if err != nil {
		return 0, err
	}
	ticks := sumFields(f, 11, 12, 13, 14) // utime stime cutime cstime (fields 14-17)
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", s.postmaster, s.postmaster))
	if err != nil {
		return 0, err
	}
	for _, k := range strings.Fields(string(kids)) {
		pid, _ := strconv.Atoi(k)
		if cf, err := procStat(pid); err == nil {
			ticks += sumFields(cf, 11, 12) // utime stime
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// ProcessCPU is the CPU time (user + system) process pid has used so far: one backend's, where Used is
// the whole server's.
func ProcessCPU(pid int) (time.Duration, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, fmt.Errorf("the server's backend %d is not a process here: %w", pid, err)
	}
	return time.Duration(sumFields(f, 11, 12)) * time.Second / clockTicks, nil // utime stime
}

// procStat is /proc/PID/stat split into fields after the command name: [0] is the state (field 3).
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return strings.Fields(s[i+1:]), nil
}

// sumFields adds stat fields given by their index in procStat's slice (field number - 3).
func sumFields(f []string, idx ...int) int64 {
	var n int64
	for _, i := range idx {
		if i < len(f) {
			v, _ := strconv.ParseInt(f[i], 10, 64)
			n += v
		}
	}
	return n
}
