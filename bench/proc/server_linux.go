//go:build linux

package proc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Server measures a PostgreSQL server on this machine: the CPU time (user + system) used by the
// postmaster and all its processes over a phase, from a Mark to Since.
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

// Mark is the server's CPU readings at one moment: the postmaster's own time with that of its
// children reaped so far, and each living child's own time so far.
type Mark struct {
	postmaster int64           // ticks: utime stime cutime cstime
	children   map[child]int64 // ticks: utime stime
}

// child names a process by its pid and its start time, so that a reused pid is another child.
type child struct {
	pid     int
	started string
}

// Mark reads the server's CPU now.
func (s *Server) Mark() (Mark, error) {
	// A child reaped while its siblings are read would be counted twice or not at all: the reaped
	// time (cutime, cstime) is read on both sides, and the reading taken again when it moved.
	for range 10 {
		m, steady, err := s.read()
		if err != nil || steady {
			return m, err
		}
	}
	return Mark{}, errors.New("the postmaster kept reaping children while its CPU was read")
}

// read is one reading, and whether no child was reaped while it was taken.
func (s *Server) read() (m Mark, steady bool, err error) {
	before, err := procStat(s.postmaster)
	if err != nil {
		return Mark{}, false, err
	}
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", s.postmaster, s.postmaster))
	if err != nil {
		return Mark{}, false, err
	}
	m.children = map[child]int64{}
	for _, k := range strings.Fields(string(kids)) {
		pid, _ := strconv.Atoi(k)
		if cf, err := procStat(pid); err == nil && len(cf) > startTimeField {
			m.children[child{pid, cf[startTimeField]}] = sumFields(cf, 11, 12) // utime stime
		}
	}
	after, err := procStat(s.postmaster)
	if err != nil {
		return Mark{}, false, err
	}
	m.postmaster = sumFields(after, 11, 12, 13, 14) // utime stime cutime cstime (fields 14-17)
	return m, sumFields(before, 13, 14) == sumFields(after, 13, 14), nil
}

// startTimeField is the index of starttime (field 22) in procStat's slice.
const startTimeField = 19

// Since is the server's CPU time from m to now: what every child used after m, whether it lived
// through the phase, was born in it or exited in it (its time before m is not the phase's), and the
// postmaster's own.
func (s *Server) Since(m Mark) (time.Duration, error) {
	now, err := s.Mark()
	if err != nil {
		return 0, err
	}
	ticks := now.postmaster - m.postmaster // the postmaster's own, and the whole lives of children reaped since m
	for c, t := range now.children {
		ticks += t - m.children[c] // living: what it used since m (all of it when born since)
	}
	for c, t := range m.children {
		if _, living := now.children[c]; !living {
			ticks -= t // reaped since m: its time before m is in the reaped time too
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
