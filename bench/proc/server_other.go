//go:build !linux

package main

import (
	"errors"
	"time"
)

// serverCPU needs /proc (Linux): elsewhere the server's CPU is not measured.
type serverCPU struct{}

func newServerCPU(int) (*serverCPU, error) {
	return nil, errors.New("server CPU is read from /proc, Linux only")
}

func (s *serverCPU) used() (time.Duration, error) { return 0, errors.ErrUnsupported }
