package pgtest

import "syscall"

// sysProcAttr: own process group (terminal signals go to us, and we decide
// how to shut the server down), the credentials to run as (nil: ourselves),
// and SIGQUIT (immediate shutdown) if our thread/process dies first. Go sets
// the parent-death signal after switching credentials, so it survives setuid.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred, Pdeathsig: syscall.SIGQUIT}
}
