//go:build !linux

package proctest

import "syscall"

// sysProcAttr has nothing to add where the kernel cannot tie a child's life
// to its parent's; Cleanup still kills and reaps every process.
func sysProcAttr() *syscall.SysProcAttr { return nil }
