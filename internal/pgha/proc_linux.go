package pgha

import (
	"bytes"
	"os"
	"strconv"
	"strings"
)

// procInfo is what /proc/PID/stat says of a process that matters here.
type procInfo struct {
	ppid  int
	state byte // R, S, D, T (stopped), Z (zombie), ...
}

// procs reads every process's parent and state from /proc.
func procs() map[int]procInfo {
	out := map[int]procInfo{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses: cut at the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		out[pid] = procInfo{ppid: ppid, state: f[0][0]}
	}
	return out
}

// descendants lists the live descendants of pid (children, theirs, ...).
func descendants(pid int) []int {
	children := map[int][]int{}
	for p, st := range procs() {
		if st.state != 'Z' {
			children[st.ppid] = append(children[st.ppid], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// processesNaming lists the live processes whose command line contains s.
func processesNaming(s string) []int {
	self := os.Getpid()
	var out []int
	for pid, st := range procs() {
		if pid == self || st.state == 'Z' {
			continue
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err == nil && bytes.Contains(b, []byte(s)) {
			out = append(out, pid)
		}
	}
	return out
}
