//go:build !linux

package pgtest

import "syscall"

// sysProcAttr: own process group and the credentials to run as (nil:
// ourselves). Without Linux's parent-death signal, a killed test binary can
// leave its postgres running; it is stopped at the end of Main otherwise.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}
