//go:build !linux

package proc

import (
	"errors"
	"time"
)

// Server needs /proc (Linux): elsewhere the server's CPU is not measured.
type Server struct{}

// NewServer always fails here.
func NewServer(int) (*Server, error) {
	return nil, errors.New("server CPU is read from /proc, Linux only")
}

// Mark is empty here.
type Mark struct{}

// Mark is not read here.
func (s *Server) Mark() (Mark, error) { return Mark{}, errors.ErrUnsupported }

// Since is not measured here.
func (s *Server) Since(Mark) (time.Duration, error) { return 0, errors.ErrUnsupported }

// ProcessCPU is not measured here.
func ProcessCPU(int) (time.Duration, error) { return 0, errors.ErrUnsupported }
