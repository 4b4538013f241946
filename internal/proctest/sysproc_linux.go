package proctest

import "syscall"

// sysProcAttr asks the kernel to kill the child when the test process dies
// (a test binary killed by its timeout, say), so no role process outlives
// the test run even when Cleanup never runs.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
